//! AFL++ entry point of the `slots` target (see the crate docs).
fn main() {
    afl::fuzz!(|data: &[u8]| omen_fuzz::slots(data));
}
