//! AFL++ entry point of the `nsys_sqlite` target (see the crate docs).
fn main() {
    afl::fuzz!(|data: &[u8]| omen_fuzz::nsys_sqlite(data));
}
