//! With the `lstm` or `bertscore` feature, the `omen` binary and the tests link libtorch; tch's
//! own rpath covers only tch's targets, so point ours at `$LIBTORCH/lib` (set by .cargo/config.toml).

fn main() {
    println!("cargo:rerun-if-env-changed=LIBTORCH");
    if std::env::var_os("CARGO_FEATURE_LSTM").is_none()
        && std::env::var_os("CARGO_FEATURE_BERTSCORE").is_none()
    {
        return;
    }
    let Some(libtorch) = std::env::var_os("LIBTORCH") else {
        // torch-sys reports a missing libtorch with the fix; nothing to add here.
        return;
    };
    let libtorch = std::path::PathBuf::from(libtorch);
    let libtorch = libtorch.canonicalize().unwrap_or(libtorch);
    println!("cargo:rustc-link-arg=-Wl,-rpath,{}/lib", libtorch.display());
}
