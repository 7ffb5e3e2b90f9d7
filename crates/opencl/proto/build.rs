//! Generates the opcode table and the handle and callback kinds from the single API
//! description (`api/opencl.api`).
fn main() {
    let api_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("api/opencl.api");
    println!("cargo:rerun-if-changed={}", api_path.display());
    let api = wormhole_apigen::Api::load(&api_path).unwrap_or_else(|e| panic!("{e}"));
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("proto.rs");
    std::fs::write(out, wormhole_apigen::emit_proto(&api)).unwrap();

    // The extensions the client cannot offer (their host commands are not all forwarded).
    let table_path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("api/extensions.tsv");
    println!("cargo:rerun-if-changed={}", table_path.display());
    let table = std::fs::read_to_string(&table_path).unwrap();
    let table = wormhole_apigen::parse_extensions(&table).unwrap_or_else(|e| panic!("{e}"));
    // cl_khr_icd is the loader's contract, which the client keeps itself (clIcdGetPlatformIDsKHR;
    // the loader does without the optional ICD-2 entry points).
    let by_client = ["cl_khr_icd"];
    let hidden = wormhole_apigen::hidden_extensions(&api, &table, &by_client);
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("extensions.rs");
    std::fs::write(
        out,
        wormhole_apigen::emit_hidden_extensions(&table, &hidden),
    )
    .unwrap();
}
