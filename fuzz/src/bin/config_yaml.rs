//! AFL++ entry point of the `config_yaml` target (see the crate docs).
fn main() {
    afl::fuzz!(|data: &[u8]| omen_fuzz::config_yaml(data));
}
