//! AFL++ entry point of the `trace_jsonl` target (see the crate docs).
fn main() {
    afl::fuzz!(|data: &[u8]| omen_fuzz::trace_jsonl(data));
}
