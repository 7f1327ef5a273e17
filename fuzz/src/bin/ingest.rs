//! AFL++ entry point of the `ingest` target (see the crate docs).
fn main() {
    afl::fuzz!(|data: &[u8]| omen_fuzz::ingest(data));
}
