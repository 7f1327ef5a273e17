//! Reading the bench's YAML inputs (workflows, tolerance and price tables) with errors that
//! name the kind of file, the file, the field path and where the schema is shown.

use std::path::Path;

use serde::de::DeserializeOwned;

/// What kind of input a file is, for its errors.
#[derive(Debug, Clone, Copy)]
pub struct Kind {
    /// E.g. `workflow`, `price table`.
    pub name: &'static str,
    /// A commented example of the schema, e.g. `deploy/workflows/chat.yaml`.
    pub example: &'static str,
}

/// A YAML input could not be read, or does not match its schema.
#[derive(Debug, thiserror::Error)]
pub enum YamlError {
    /// The file could not be read.
    #[error("cannot read {} {path}: {source}; check the path", kind.name)]
    Read {
        /// What the file is.
        kind: Kind,
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The YAML does not match the schema.
    #[error("{} {path}: {field}: {message}; see {} for the schema", kind.name, kind.example)]
    Parse {
        /// What the file is.
        kind: Kind,
        /// The file.
        path: String,
        /// Field path of the error, e.g. `states.greet.timeout`.
        field: String,
        /// The parser's message.
        message: String,
    },
}

/// The text of `path` and the name to show for it.
pub fn read(path: &Path, kind: Kind) -> Result<(String, String), YamlError> {
    let name = path.display().to_string();
    match std::fs::read_to_string(path) {
        Ok(text) => Ok((text, name)),
        Err(source) => Err(YamlError::Read { kind, path: name, source }),
    }
}

/// `text` as a `T`; `path` only names the input in errors.
pub fn parse<T: DeserializeOwned>(text: &str, path: &str, kind: Kind) -> Result<T, YamlError> {
    serde_path_to_error::deserialize(serde_yaml::Deserializer::from_str(text)).map_err(|e| YamlError::Parse {
        kind,
        path: path.to_owned(),
        field: e.path().to_string(),
        message: e.inner().to_string(),
    })
}
