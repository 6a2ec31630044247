//! Link the shared object as rdma-core's libraries are linked: SONAME `libibverbs.so.1` and the
//! version nodes of rdma-core 44 (each exported function is bound to its node in the source with
//! `.symver`, see `src/export.rs`).

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=versions.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/versions.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libibverbs.so.1");
}
