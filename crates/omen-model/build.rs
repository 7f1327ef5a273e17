//! With the `torch` feature, tests, benches and examples link libtorch.

#[path = "../../build-support/libtorch_rpath.rs"]
mod libtorch_rpath;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if std::env::var_os("CARGO_FEATURE_TORCH").is_some() {
        libtorch_rpath::emit();
    }
}
