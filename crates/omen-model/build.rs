//! With the `torch` feature, adds an rpath to libtorch so tests and benches find it at run time.

use std::path::PathBuf;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if std::env::var_os("CARGO_FEATURE_TORCH").is_none() {
        return;
    }
    if let Some(dir) = std::env::var_os("LIBTORCH") {
        let dir = PathBuf::from(dir);
        let dir = std::fs::canonicalize(&dir).unwrap_or(dir);
        println!("cargo:rustc-link-arg=-Wl,-rpath,{}/lib", dir.display());
    }
}
