//! With the `lstm` or `bertscore` feature, the `omen` binary and the tests link libtorch.

#[path = "../../build-support/libtorch_rpath.rs"]
mod libtorch_rpath;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if std::env::var_os("CARGO_FEATURE_LSTM").is_some()
        || std::env::var_os("CARGO_FEATURE_BERTSCORE").is_some()
    {
        libtorch_rpath::emit();
    }
}
