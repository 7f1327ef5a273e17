//! docs/signals.md's catalogue table is the catalogue: generated from
//! `omen_signals::catalogue::ALL`, checked here, rewritten with `OMEN_UPDATE_DOCS=1`.

use std::path::Path;

use omen_signals::catalogue::{Kind, ALL};

const BEGIN: &str = "<!-- catalogue:begin -->\n";
const END: &str = "<!-- catalogue:end -->";

fn table() -> String {
    let mut t = String::from(
        "| name | kind | unit | OTLP name | derived | SLO indicator | help |\n|---|---|---|---|---|---|---|\n",
    );
    for s in ALL {
        let kind = match s.kind {
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        };
        t.push_str(&format!(
            "| `{}` | {kind} | {} | `{}` | {} | {} | {} |\n",
            s.name,
            if s.unit.is_empty() { "-" } else { s.unit },
            s.otlp_name,
            if s.derived { "yes" } else { "no" },
            s.indicator.map_or_else(|| "-".to_owned(), |i| format!("`{i}`")),
            s.help.replace('|', "\\|"),
        ));
    }
    t
}

#[test]
fn the_docs_table_is_the_catalogue() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/signals.md");
    let doc = std::fs::read_to_string(&path).unwrap();
    let start = doc.find(BEGIN).expect("docs/signals.md has the catalogue:begin marker") + BEGIN.len();
    let end = doc.find(END).expect("docs/signals.md has the catalogue:end marker");
    let want = table();
    if doc[start..end] != want {
        if std::env::var_os("OMEN_UPDATE_DOCS").is_some() {
            std::fs::write(&path, format!("{}{want}{}", &doc[..start], &doc[end..])).unwrap();
            return;
        }
        panic!(
            "docs/signals.md's catalogue table differs from crates/omen-signals/src/catalogue.rs; \
             run `OMEN_UPDATE_DOCS=1 cargo test -p omen-signals --test catalogue_doc` and commit the result"
        );
    }
}
