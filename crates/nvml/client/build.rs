//! Generates the client's exported entry points from the API description, and names the
//! library as the one it stands in for.
fn main() {
    let api_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/api/nvml.api");
    println!("cargo:rerun-if-changed={}", api_path.display());
    let api = wormhole_apigen::Api::load(&api_path).unwrap_or_else(|e| panic!("{e}"));
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("client_gen.rs");
    std::fs::write(out, wormhole_apigen::emit_client(&api)).unwrap();
    // Programs (and bindings that dlopen it) look for NVML by this soname.
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnvidia-ml.so.1");
}
