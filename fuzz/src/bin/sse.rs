//! AFL++ entry point of the `sse` target (see the crate docs).
fn main() {
    afl::fuzz!(|data: &[u8]| omen_fuzz::sse(data));
}
