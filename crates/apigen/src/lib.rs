//! Wormhole's API generator: one description of the API (`crates/opencl/proto/api/*.api`) becomes
//! the opcode table (protocol), the client's forwarding stubs and ICD dispatch table (client) and
//! the server's decoders and dispatch (server). Build scripts call the `emit_*` functions.
//!
//! Generated plumbing, hand-written behaviour: the generated code encodes, decodes, resolves
//! handles and calls; anything with semantics of its own lives in hand-written modules that the
//! generated code calls by name (`custom`, `local`, `info`, `props`, `callbacks`).

mod abi_check;
mod client;
mod extensions;
mod model;
mod server;

pub use abi_check::{abi_classes, emit_abi_check, emit_value_check, nvidia_headers, run_abi_check};
pub use client::emit_client;
pub use extensions::{emit_hidden_extensions, hidden_extensions, parse_extensions, Extension};
pub use model::*;
pub use server::emit_server;

use std::fmt::Write;

/// The Rust type a C parameter of this kind has in `extern "C"` signatures.
pub(crate) fn c_type(k: &Kind) -> &'static str {
    match k {
        Kind::Scalar(Scalar::U8) => "u8",
        Kind::Scalar(Scalar::U16) => "u16",
        Kind::Scalar(Scalar::U32) => "u32",
        Kind::Scalar(Scalar::I32) | Kind::DeviceNumber => "i32",
        Kind::Scalar(Scalar::U64) | Kind::Device { .. } => "u64",
        Kind::Scalar(Scalar::Usize) => "usize",
        Kind::Handle { .. } => "Handle",
        Kind::Handles { .. } => "*const Handle",
        Kind::In { .. } => "*const c_void",
        Kind::InUsize { .. } => "*const usize",
        Kind::Str => "*const c_char",
        Kind::Strs { .. } => "*const *const c_char",
        Kind::Props(_) => "*const u64",
        Kind::Out { .. } => "*mut c_void",
        Kind::OutSize => "*mut usize",
        Kind::OutU32 => "*mut u32",
        Kind::OutU64 => "*mut u64",
        Kind::OutHandles { .. } => "*mut Handle",
        Kind::NewHandle { .. } => "*mut Handle",
        Kind::Callback { .. } => "*const c_void",
        Kind::UserData => "*mut c_void",
        Kind::Err => "*mut i32",
    }
}

pub(crate) fn ret_type(r: &Ret) -> &'static str {
    match r {
        Ret::Int => "i32",
        Ret::Handle(_) | Ret::Ptr => "*mut c_void",
        Ret::Void => "()",
    }
}

/// `name: type, ...` for an `extern "C"` signature.
pub(crate) fn signature(f: &Func) -> String {
    f.params
        .iter()
        .map(|p| format!("{}: {}", p.name, c_type(&p.kind)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The API's vocabulary for its `proto` crate: the `Op` enum (one variant per entry point,
/// its value the opcode) and the handle and callback kinds, all from the description.
pub fn emit_proto(api: &Api) -> String {
    let mut s = emit_opcodes(api);
    emit_kinds(&mut s, api);
    s
}

fn emit_kinds(s: &mut String, api: &Api) {
    let _ = writeln!(s, "\n/// The object types of the API (the description's `@handle`). A handle on the wire is a\n/// u64 id of one of these kinds.\n#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]\n#[repr(u8)]\npub enum HandleKind {{");
    for (i, h) in api.handles.iter().enumerate() {
        let _ = writeln!(s, "    {} = {},", h.variant, i + 1);
    }
    s.push_str("}\n\nimpl HandleKind {\n    /// The status the native API returns for an invalid object of this kind.\n    pub fn invalid_code(self) -> i32 {\n        match self {\n");
    for h in &api.handles {
        let _ = writeln!(
            s,
            "            HandleKind::{} => codes::{},",
            h.variant, h.invalid
        );
    }
    s.push_str("        }\n    }\n\n    pub fn from_u8(v: u8) -> Option<HandleKind> {\n        match v {\n");
    for (i, h) in api.handles.iter().enumerate() {
        let _ = writeln!(
            s,
            "            {} => Some(HandleKind::{}),",
            i + 1,
            h.variant
        );
    }
    s.push_str("            _ => None,\n        }\n    }\n\n    /// Objects whose lifetime the application does not manage.\n    pub fn is_permanent(self) -> bool {\n        matches!(self, ");
    let permanent: Vec<String> = api
        .handles
        .iter()
        .filter(|h| h.permanent)
        .map(|h| format!("HandleKind::{}", h.variant))
        .collect();
    s.push_str(if permanent.is_empty() {
        "_ if false"
    } else {
        ""
    });
    s.push_str(&permanent.join(" | "));
    s.push_str(")\n    }\n}\n");
    // A representation is refused for an enum without variants (an API without callbacks).
    let repr = if api.callbacks.is_empty() {
        ""
    } else {
        "#[repr(u8)]\n"
    };
    let _ = writeln!(s, "\n/// The callback signatures of the API (the description's `@callback`).\n#[derive(Debug, Clone, Copy, PartialEq, Eq)]\n{repr}pub enum CallbackKind {{");
    for (i, (_, v)) in api.callbacks.iter().enumerate() {
        let _ = writeln!(s, "    {} = {},", v, i + 1);
    }
    s.push_str("}\n\nimpl CallbackKind {\n    pub fn from_u8(v: u8) -> Option<CallbackKind> {\n        match v {\n");
    for (i, (_, v)) in api.callbacks.iter().enumerate() {
        let _ = writeln!(s, "            {} => Some(CallbackKind::{}),", i + 1, v);
    }
    s.push_str("            _ => None,\n        }\n    }\n}\n");
}

/// The `Op` enum: one variant per entry point, its value the opcode.
pub fn emit_opcodes(api: &Api) -> String {
    let mut s =
        String::from("// @generated by wormhole-apigen from the API description. Do not edit.\n\n");
    s.push_str(
        "/// Every entry point of the API, numbered as in the description (the ICD slot).\n",
    );
    s.push_str("#[allow(non_camel_case_types, clippy::upper_case_acronyms)]\n");
    s.push_str("#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]\n#[repr(u16)]\npub enum Op {\n");
    for f in &api.funcs {
        let _ = writeln!(s, "    {} = {},", f.name, f.opcode);
    }
    s.push_str("}\n\n");
    let _ = writeln!(s, "/// Number of entry points (opcodes 0..OP_COUNT).");
    let _ = writeln!(s, "pub const OP_COUNT: u16 = {};\n", api.funcs.len());
    s.push_str("impl Op {\n    /// The entry point with this opcode, if there is one.\n    pub fn from_u16(v: u16) -> Option<Op> {\n        match v {\n");
    for f in &api.funcs {
        let _ = writeln!(s, "            {} => Some(Op::{}),", f.opcode, f.name);
    }
    s.push_str("            _ => None,\n        }\n    }\n\n    /// The C name of the entry point.\n    pub fn name(self) -> &'static str {\n        match self {\n");
    for f in &api.funcs {
        let _ = writeln!(s, "            Op::{0} => \"{0}\",", f.name);
    }
    s.push_str("        }\n    }\n\n    /// A synchronisation point (`@sync` in the description).\n    pub fn is_sync(self) -> bool {\n        matches!(self, ");
    let sync: Vec<String> = api
        .funcs
        .iter()
        .filter(|f| f.sync)
        .map(|f| format!("Op::{}", f.name))
        .collect();
    s.push_str(if sync.is_empty() { "_ if false" } else { "" });
    s.push_str(&sync.join(" | "));
    s.push_str(")\n    }\n}\n");
    s
}

/// Rust expression (a `usize`) for a length, given the local names of decoded scalars.
pub(crate) fn len_expr(l: &Len) -> String {
    match l {
        Len::Const(n) => format!("Some({n}usize)"),
        Len::Param(p) => format!("usize::try_from({p}).ok()"),
        Len::Mul(p, n) => format!("usize::try_from({p}).ok().and_then(|v| v.checked_mul({n}))"),
    }
}

/// `use` lines for the proto crate's items only some APIs have (property lists, callbacks):
/// generated code names them only where the description uses them.
pub(crate) fn optional_imports(api: &Api) -> String {
    let mut s = String::new();
    let uses = |pred: &dyn Fn(&Kind) -> bool| {
        api.funcs
            .iter()
            .any(|f| f.is_generated() && f.params.iter().any(|p| pred(&p.kind)))
    };
    if uses(&|k| matches!(k, Kind::Props(_))) {
        let _ = writeln!(s, "use {}::Props;", api.proto);
    }
    if uses(&|k| matches!(k, Kind::Callback { .. })) {
        let _ = writeln!(s, "use {}::CallbackKind;", api.proto);
    }
    s
}

/// The API's status values under names the generated code uses whatever the API.
pub(crate) fn emit_status_consts(s: &mut String, api: &Api) {
    let _ = writeln!(
        s,
        "/// The API's success status (the description's `@status`).\n#[allow(dead_code)]\nconst STATUS_SUCCESS: {0} = {1};\n/// What Wormhole answers for what it does not forward.\n#[allow(dead_code)]\nconst STATUS_UNSUPPORTED: {0} = {2};\n",
        api.status.ty, api.status.success, api.status.unsupported
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "@api toy\n@proto toy_proto\n@status i32 success=TOY_OK unsupported=TOY_NO\n@handle thing Thing TOY_BAD_THING\n@callback done Done\n";

    fn parse(abi: &str, funcs: &str) -> Result<Api, ParseError> {
        Api::parse(&format!("{HEADER}@abi {abi}\n{funcs}"))
    }

    #[test]
    fn the_header_declares_the_api() {
        let api = parse("icd", "0 toyGet gen (h<thing> t, out_u32 v)\n").unwrap();
        assert_eq!(api.name, "toy");
        assert_eq!(api.abi, Abi::Icd);
        assert_eq!(api.handle_variant("thing"), "Thing");
        assert_eq!(api.list_error("t", "thing"), "TOY_BAD_THING");
        let proto = emit_proto(&api);
        assert!(proto.contains("HandleKind::Thing => codes::TOY_BAD_THING"));
        assert!(proto.contains("Done = 1"));
        let client = emit_client(&api);
        assert!(client.contains("use toy_proto::"));
        assert!(client.contains("const STATUS_SUCCESS: i32 = TOY_OK;"));
        assert!(client.contains("pub static DISPATCH"));
        assert!(!client.contains("#[no_mangle]"));
    }

    #[test]
    fn an_exports_api_exports_every_entry_point_by_name() {
        let api = parse(
            "exports",
            "0 toyGet gen (h<thing> t, out_u32 v)\n1 toyPut gen (h<thing> t, u32 v)\n",
        )
        .unwrap();
        let client = emit_client(&api);
        assert!(client.contains("#[no_mangle]\npub unsafe extern \"C\" fn toyGet("));
        assert!(client.contains("#[no_mangle]\npub unsafe extern \"C\" fn toyPut("));
        assert!(!client.contains("DISPATCH"));
        assert!(client.contains("b\"toyPut\" =>"));
    }

    #[test]
    fn a_description_without_its_header_or_with_unknown_kinds_is_refused() {
        let no_abi = Api::parse(&format!("{HEADER}0 toyGet gen (u32 v)\n")).unwrap_err();
        assert!(no_abi.msg.contains("@abi"), "{no_abi}");
        let bad = parse("icd", "0 toyGet gen (h<gadget> g)\n").unwrap_err();
        assert!(bad.msg.contains("unknown handle kind"), "{bad}");
        assert!(parse("vtable", "").is_err());
        let gap = parse("icd", "1 toyGet gen (u32 v)\n").unwrap_err();
        assert!(gap.msg.contains("dense"), "{gap}");
    }

    #[test]
    fn a_call_that_forgets_asks_the_client_to_forget_once_its_request_went() {
        let api = parse(
            "exports",
            "0 toySet gen @forgets(things) @forgets(sizes) (h<thing> t, u32 v)\n",
        )
        .unwrap();
        let client = emit_client(&api);
        let call = client.find("rt::call(w)?").unwrap();
        let things = client.find("rt::forget_things();").unwrap();
        let sizes = client.find("rt::forget_sizes();").unwrap();
        assert!(call < things && things < sizes, "{client}");
        let hand = parse("exports", "0 toySet custom @forgets(things) (u32 v)\n").unwrap_err();
        assert!(hand.msg.contains("@forgets"), "{hand}");
        let unwaited = parse("exports", "0 toySet gen @async @forgets(things) (u32 v)\n");
        assert!(unwaited.unwrap_err().msg.contains("@async"));
    }
}
