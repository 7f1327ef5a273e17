//! AFL++ entry point of the `prom_text` target (see the crate docs).
fn main() {
    afl::fuzz!(|data: &[u8]| omen_fuzz::prom_text(data));
}
