//! Link libintentkv: from $INTENTKV_LIB_DIR when set (a build dir or an install's lib dir), else the
//! system linker path (an installed library).
fn main() {
    println!("cargo:rerun-if-env-changed=INTENTKV_LIB_DIR");
    if let Ok(dir) = std::env::var("INTENTKV_LIB_DIR") {
        println!("cargo:rustc-link-search=native={dir}");
        // Let `cargo test` find the shared library without LD_LIBRARY_PATH on ELF platforms.
        if cfg!(target_os = "linux") {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
    }
    println!("cargo:rustc-link-lib=dylib=intentkv");
}
