//! Shared by the build scripts of the crates whose targets link libtorch: tch's own
//! rpath covers only tch's targets, so theirs point at `$LIBTORCH/lib` (set by
//! .cargo/config.toml). Included with `#[path]`; build scripts cannot share a crate.

/// Prints the rpath link argument for `$LIBTORCH/lib` (callers print rerun-if-env-changed).
pub fn emit() {
    let Some(libtorch) = std::env::var_os("LIBTORCH") else {
        // torch-sys reports a missing libtorch with the fix; nothing to add here.
        return;
    };
    let libtorch = std::path::PathBuf::from(libtorch);
    let libtorch = libtorch.canonicalize().unwrap_or(libtorch);
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}/lib", libtorch.display());
}
