//! Generates the server's decoders and dispatch from the API description.
fn main() {
    let api_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../proto/api/nvml.api");
    println!("cargo:rerun-if-changed={}", api_path.display());
    let api = wormhole_apigen::Api::load(&api_path).unwrap_or_else(|e| panic!("{e}"));
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("server_gen.rs");
    std::fs::write(out, wormhole_apigen::emit_server(&api)).unwrap();
}
