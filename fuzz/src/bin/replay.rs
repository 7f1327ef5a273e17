//! Runs every file of `corpus/<target>/` (or the folders given) through its target without
//! AFL: a regression test over the committed corpora. Usage: `replay [corpus-root]`.
fn main() {
    let root =
        std::env::args().nth(1).unwrap_or_else(|| concat!(env!("CARGO_MANIFEST_DIR"), "/corpus").to_owned());
    let mut total = 0;
    for (name, target) in omen_fuzz::TARGETS {
        let dir = std::path::Path::new(&root).join(name);
        let Ok(entries) = std::fs::read_dir(&dir) else {
            eprintln!("replay: no corpus for {name} in {}", dir.display());
            std::process::exit(1);
        };
        let mut n = 0;
        for entry in entries.flatten() {
            let data = std::fs::read(entry.path()).expect("read a corpus file");
            target(&data);
            n += 1;
        }
        println!("replay: {name}: {n} inputs, no panic");
        total += n;
    }
    println!("replay: {total} inputs in all");
}
