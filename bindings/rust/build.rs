//! Link libintentkv, found in this order:
//! 1. $INTENTKV_LIB_DIR when set (a build dir or an install's lib dir): the override;
//! 2. the `pkg-config` program (`pkg-config --libs-only-L intentkv`), as C engines link it;
//! 3. the system linker path (an installed library).
//! No build-dependency crates: the crates registry may be out of reach.
use std::process::Command;

fn link_dir(dir: &str) {
    println!("cargo:rustc-link-search=native={dir}");
    // Let `cargo test` and examples find the shared library without LD_LIBRARY_PATH on ELF platforms.
    if cfg!(target_os = "linux") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}

fn main() {
    println!("cargo:rerun-if-env-changed=INTENTKV_LIB_DIR");
    println!("cargo:rerun-if-env-changed=PKG_CONFIG_PATH");
    if let Ok(dir) = std::env::var("INTENTKV_LIB_DIR") {
        link_dir(&dir);
    } else if let Ok(out) = Command::new("pkg-config").args(["--libs-only-L", "intentkv"]).output() {
        if out.status.success() {
            for flag in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                if let Some(dir) = flag.strip_prefix("-L") {
                    link_dir(dir);
                }
            }
        }
    }
    println!("cargo:rustc-link-lib=dylib=intentkv");
}
