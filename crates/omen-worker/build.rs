//! The worker links libtorch (tch); its path is written into the binary's rpath.

#[path = "../../build-support/libtorch_rpath.rs"]
mod libtorch_rpath;

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    libtorch_rpath::emit();
}
