//! AFL++ entry point of the `scores_query` target (see the crate docs).
fn main() {
    afl::fuzz!(|data: &[u8]| omen_fuzz::scores_query(data));
}
