//! The API description: its grammar (see `crates/opencl/proto/api/opencl.api`) and parser.

use std::fmt;

/// A whole API description: what the API is (its header of `@` directives) and every entry
/// point, ordered by opcode.
#[derive(Debug)]
pub struct Api {
    /// The API's name in HELLO (`@api opencl`).
    pub name: String,
    /// The crate of the API's wire vocabulary that generated code names (`@proto`).
    pub proto: String,
    /// How entry points report errors (`@status`).
    pub status: Status,
    /// How the client library exposes the entry points (`@abi`).
    pub abi: Abi,
    /// The API's object kinds (`@handle`), in the order of their wire numbers (from 1).
    pub handles: Vec<HandleDecl>,
    /// The callback signatures (`@callback`), numbered from 1.
    pub callbacks: Vec<(String, String)>,
    /// Parameters by name whose bad handle list has an error of its own (`@list_error`).
    pub list_errors: Vec<(String, String)>,
    pub funcs: Vec<Func>,
}

/// The status model: entry points return a status of type `ty` (and functions that return an
/// object write it to their `err` parameter); `success` is the success value and
/// `unsupported` the answer for what Wormhole does not forward.
#[derive(Debug, Clone)]
pub struct Status {
    pub ty: String,
    pub success: String,
    pub unsupported: String,
}

/// How the client library exposes the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Abi {
    /// An installable client driver: a dispatch table indexed by opcode that every object
    /// points to (OpenCL's ICD loader contract), plus a name lookup for extension functions.
    Icd,
    /// A library that exports every entry point by name (`#[no_mangle]`), plus a name lookup
    /// for a proc-address query (the CUDA driver's `cuGetProcAddress`).
    Exports,
}

/// One object kind: its name in the description, its Rust variant, the status a bad handle of
/// it gets, and whether the application manages its lifetime.
#[derive(Debug, Clone)]
pub struct HandleDecl {
    pub name: String,
    pub variant: String,
    pub invalid: String,
    pub permanent: bool,
}

#[derive(Debug)]
pub struct Func {
    pub opcode: u16,
    pub name: String,
    pub mode: Mode,
    pub info: bool,
    /// The ICD table points at a hand-written client function although the wire stub and the
    /// server dispatch are generated (answers cached in the client).
    pub client_entry: bool,
    /// The server handler is hand-written (server/src/custom) although the client stub and the
    /// wire encoding are generated: it must decode exactly what the generated stub encodes.
    pub server_entry: bool,
    /// Answered in the client (`local`), but the server calls the real entry point for work of
    /// its own (its ffi table has it).
    pub driver: bool,
    pub retain: Option<String>,
    pub release: Option<String>,
    /// What the client keeps that the call may make stale (`@forgets(what)`): after its
    /// request went, the stub calls `rt::forget_<what>()`.
    pub forgets: Vec<String>,
    /// A synchronisation point: data of finished non-blocking reads is collected after it.
    pub sync: bool,
    /// Sent without waiting for the reply: every error it can return is checked in the client.
    pub asynchronous: bool,
    /// The API version whose ABI of the entry point this symbol is (`@since(V)`), for a
    /// version-aware proc-address query (CUDA's `cuGetProcAddress`).
    pub since: Option<u32>,
    pub ret: Ret,
    pub params: Vec<Param>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Gen,
    Custom,
    Local,
    Unsupported,
    Absent,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ret {
    Int,
    Handle(String),
    Ptr,
    Void,
}

#[derive(Debug, Clone)]
pub struct Param {
    pub name: String,
    pub kind: Kind,
}

/// A length: a parameter's value, a constant, or a parameter times a constant.
#[derive(Debug, Clone)]
pub enum Len {
    Param(String),
    Const(u64),
    Mul(String, u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scalar {
    /// `unsigned char` and `unsigned short` (CUDA's memset values): carried as a u32.
    U8,
    U16,
    U32,
    I32,
    U64,
    Usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Props {
    Plain,
    Context,
    Partition,
}

#[derive(Debug, Clone)]
pub enum Kind {
    Scalar(Scalar),
    Handle {
        kind: String,
        nullable: bool,
    },
    Handles {
        kind: String,
        count: String,
    },
    In {
        len: Len,
    },
    InUsize {
        count: Len,
        nullable: bool,
    },
    Str,
    Strs {
        count: String,
    },
    Props(Props),
    Out {
        len: Len,
    },
    OutSize,
    OutU32,
    OutU64,
    OutHandles {
        kind: String,
        count: String,
    },
    NewHandle {
        kind: String,
    },
    /// A device address (CUDA's `CUdeviceptr`) and the length the call touches there: the
    /// server checks that the session owns `[address, address + len)` before the driver sees it.
    Device {
        len: Len,
    },
    /// A device by the tenant's numbering (CUDA's `CUdevice`): the tenant sees only the
    /// devices it may use, numbered from 0, and the server turns the number into the driver's
    /// before the driver sees it.
    DeviceNumber,
    Callback {
        kind: String,
        owner: String,
    },
    UserData,
    Err,
}

impl Api {
    /// The Rust name of a handle kind (`queue` → `Queue`).
    pub fn handle_variant(&self, kind: &str) -> &str {
        self.handle(kind)
            .map(|h| h.variant.as_str())
            .unwrap_or_else(|| panic!("unknown handle kind {kind}"))
    }

    pub fn handle(&self, kind: &str) -> Option<&HandleDecl> {
        self.handles.iter().find(|h| h.name == kind)
    }

    pub fn callback_variant(&self, kind: &str) -> &str {
        self.callbacks
            .iter()
            .find(|(k, _)| k == kind)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("unknown callback kind {kind}"))
    }

    /// The symbols of `list` (one per line, as `nm -D` lists a real library's) that the
    /// description lacks: a client library generated from it must export every one.
    pub fn not_described<'a>(&self, list: &'a str) -> Vec<&'a str> {
        let described: std::collections::HashSet<&str> =
            self.funcs.iter().map(|f| f.name.as_str()).collect();
        list.lines()
            .map(str::trim)
            .filter(|s| !s.is_empty() && !described.contains(s))
            .collect()
    }

    /// The status for a bad handle in list parameter `param` of handles of `kind`.
    pub fn list_error(&self, param: &str, kind: &str) -> &str {
        self.list_errors
            .iter()
            .find(|(p, _)| p == param)
            .map(|(_, e)| e.as_str())
            .unwrap_or_else(|| &self.handle(kind).expect("known kind").invalid)
    }
}

#[derive(Debug)]
pub struct ParseError {
    pub line: usize,
    pub msg: String,
}

impl fmt::Display for ParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "API description line {}: {}", self.line, self.msg)
    }
}

impl std::error::Error for ParseError {}

impl Api {
    pub fn load(path: &std::path::Path) -> Result<Api, Box<dyn std::error::Error>> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Ok(Api::parse(&text)?)
    }

    pub fn parse(text: &str) -> Result<Api, ParseError> {
        let mut api = Api {
            name: String::new(),
            proto: String::new(),
            status: Status {
                ty: String::new(),
                success: String::new(),
                unsupported: String::new(),
            },
            abi: Abi::Icd,
            handles: Vec::new(),
            callbacks: Vec::new(),
            list_errors: Vec::new(),
            funcs: Vec::new(),
        };
        let mut abi = None;
        for (i, raw) in text.lines().enumerate() {
            let line = raw.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let err = |msg: String| ParseError { line: i + 1, msg };
            if let Some(d) = line.strip_prefix('@') {
                parse_directive(&mut api, &mut abi, d).map_err(err)?;
                continue;
            }
            let func = parse_func(line).map_err(err)?;
            api.funcs.push(func);
        }
        let missing = |what: &str| ParseError {
            line: 0,
            msg: format!("the description lacks its `@{what}` directive"),
        };
        if api.name.is_empty() {
            return Err(missing("api"));
        }
        if api.proto.is_empty() {
            return Err(missing("proto"));
        }
        if api.status.ty.is_empty() {
            return Err(missing("status"));
        }
        api.abi = abi.ok_or_else(|| missing("abi"))?;
        let funcs = &api.funcs;
        // Opcodes are explicit: they must run 0, 1, 2, ... without gaps or repeats.
        for (expected, f) in funcs.iter().enumerate() {
            if usize::from(f.opcode) != expected {
                return Err(ParseError {
                    line: 0,
                    msg: format!(
                        "opcode {} ({}) where {} was expected: opcodes must be dense and ordered",
                        f.opcode, f.name, expected
                    ),
                });
            }
        }
        for f in funcs {
            validate(&api, f).map_err(|msg| ParseError {
                line: 0,
                msg: format!("{}: {msg}", f.name),
            })?;
        }
        Ok(api)
    }
}

/// One header line: `@api NAME`, `@proto CRATE`, `@status TYPE success=X unsupported=Y`,
/// `@abi icd|exports`, `@handle NAME VARIANT INVALID [permanent]`, `@callback NAME VARIANT`,
/// `@list_error PARAM STATUS`.
fn parse_directive(api: &mut Api, abi: &mut Option<Abi>, d: &str) -> Result<(), String> {
    let words: Vec<&str> = d.split_whitespace().collect();
    let arg = |i: usize| {
        words
            .get(i)
            .map(|w| w.to_string())
            .ok_or_else(|| format!("`@{d}`: missing argument {i}"))
    };
    let key = |k: &str| {
        words[1..]
            .iter()
            .find_map(|w| w.strip_prefix(k).and_then(|v| v.strip_prefix('=')))
            .map(str::to_string)
            .ok_or_else(|| format!("`@{d}`: missing {k}=..."))
    };
    match words.first().copied() {
        Some("api") => api.name = arg(1)?,
        Some("proto") => api.proto = arg(1)?,
        Some("status") => {
            api.status = Status {
                ty: arg(1)?,
                success: key("success")?,
                unsupported: key("unsupported")?,
            }
        }
        Some("abi") => {
            *abi = Some(match arg(1)?.as_str() {
                "icd" => Abi::Icd,
                "exports" => Abi::Exports,
                other => return Err(format!("unknown ABI profile `{other}` (icd or exports)")),
            })
        }
        Some("handle") => {
            let name = arg(1)?;
            if api.handle(&name).is_some() {
                return Err(format!("handle kind `{name}` declared twice"));
            }
            api.handles.push(HandleDecl {
                name,
                variant: arg(2)?,
                invalid: arg(3)?,
                permanent: match words.get(4) {
                    None => false,
                    Some(&"permanent") => true,
                    Some(w) => return Err(format!("unexpected `{w}` (permanent?)")),
                },
            });
        }
        Some("callback") => api.callbacks.push((arg(1)?, arg(2)?)),
        Some("list_error") => api.list_errors.push((arg(1)?, arg(2)?)),
        _ => return Err(format!("unknown directive `@{d}`")),
    }
    Ok(())
}

fn parse_func(line: &str) -> Result<Func, String> {
    // The parameter list is the first `(` that follows a space (`@retain(k)` has none).
    let open = line.find(" (").ok_or("missing parameter list")? + 1;
    if !line.ends_with(')') {
        return Err("parameter list must end the line".into());
    }
    let head: Vec<&str> = line[..open].split_whitespace().collect();
    let params_src = &line[open + 1..line.len() - 1];
    if head.len() < 3 {
        return Err("expected `<opcode> <name> <mode> ...`".into());
    }
    let opcode: u16 = head[0]
        .parse()
        .map_err(|_| format!("bad opcode {}", head[0]))?;
    let name = head[1].to_string();
    let mode = match head[2] {
        "gen" => Mode::Gen,
        "custom" => Mode::Custom,
        "local" => Mode::Local,
        "unsupported" => Mode::Unsupported,
        "absent" => Mode::Absent,
        m => return Err(format!("unknown mode {m}")),
    };
    let mut func = Func {
        opcode,
        name,
        mode,
        info: false,
        client_entry: false,
        server_entry: false,
        driver: false,
        retain: None,
        release: None,
        forgets: Vec::new(),
        sync: false,
        asynchronous: false,
        since: None,
        ret: Ret::Int,
        params: Vec::new(),
    };
    let mut rest = head[3..].iter();
    while let Some(tok) = rest.next() {
        match *tok {
            "@info" => func.info = true,
            "@client_entry" => func.client_entry = true,
            "@server_entry" => func.server_entry = true,
            "@driver" => func.driver = true,
            "@sync" => func.sync = true,
            "@async" => func.asynchronous = true,
            "->" => {
                let r = rest.next().ok_or("missing return kind after ->")?;
                func.ret = match *r {
                    "int" => Ret::Int,
                    "ptr" => Ret::Ptr,
                    "void" => Ret::Void,
                    h => Ret::Handle(angle(h, "h")?.to_string()),
                };
            }
            t if t.starts_with("@since(") => {
                func.since = Some(
                    paren(t)?
                        .parse()
                        .map_err(|_| format!("bad version in `{t}`"))?,
                )
            }
            t if t.starts_with("@retain(") => func.retain = Some(paren(t)?.to_string()),
            t if t.starts_with("@release(") => func.release = Some(paren(t)?.to_string()),
            t if t.starts_with("@forgets(") => func.forgets.push(paren(t)?.to_string()),
            t => return Err(format!("unexpected `{t}`")),
        }
    }
    if !func.forgets.is_empty() && func.mode != Mode::Gen {
        return Err("@forgets needs a generated stub (mode gen)".into());
    }
    if !func.forgets.is_empty() && func.asynchronous {
        // The client would forget before the server changed anything: another thread could
        // keep the old answer under the new generation.
        return Err("@forgets needs a waited call (not @async)".into());
    }
    for p in params_src
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
    {
        let (kind, pname) = p
            .rsplit_once(' ')
            .ok_or_else(|| format!("parameter `{p}` needs a kind and a name"))?;
        func.params.push(Param {
            name: pname.to_string(),
            kind: parse_kind(kind.trim())?,
        });
    }
    Ok(func)
}

fn paren(t: &str) -> Result<&str, String> {
    let a = t.find('(').ok_or("missing (")?;
    let b = t.rfind(')').ok_or("missing )")?;
    Ok(&t[a + 1..b])
}

fn angle<'a>(t: &'a str, prefix: &str) -> Result<&'a str, String> {
    let inner = t
        .strip_prefix(prefix)
        .and_then(|s| s.strip_prefix('<'))
        .and_then(|s| s.split('>').next())
        .ok_or_else(|| format!("expected {prefix}<kind> in `{t}`"))?;
    Ok(inner)
}

fn bracket(t: &str) -> Result<&str, String> {
    let a = t
        .find('[')
        .ok_or_else(|| format!("missing [..] in `{t}`"))?;
    let b = t.rfind(']').ok_or_else(|| format!("missing ] in `{t}`"))?;
    Ok(&t[a + 1..b])
}

fn parse_len(s: &str) -> Result<Len, String> {
    if let Ok(n) = s.parse::<u64>() {
        return Ok(Len::Const(n));
    }
    if let Some((p, n)) = s.split_once('*') {
        let n = n.parse::<u64>().map_err(|_| format!("bad length `{s}`"))?;
        return Ok(Len::Mul(p.to_string(), n));
    }
    Ok(Len::Param(s.to_string()))
}

fn parse_kind(k: &str) -> Result<Kind, String> {
    Ok(match k {
        "u8" => Kind::Scalar(Scalar::U8),
        "u16" => Kind::Scalar(Scalar::U16),
        "u32" => Kind::Scalar(Scalar::U32),
        "i32" => Kind::Scalar(Scalar::I32),
        "devno" => Kind::DeviceNumber,
        "u64" => Kind::Scalar(Scalar::U64),
        "usize" => Kind::Scalar(Scalar::Usize),
        "str" => Kind::Str,
        "props" => Kind::Props(Props::Plain),
        "props_ctx" => Kind::Props(Props::Context),
        "props_part" => Kind::Props(Props::Partition),
        "outsize" => Kind::OutSize,
        "out_u32" => Kind::OutU32,
        "out_u64" => Kind::OutU64,
        "ud" => Kind::UserData,
        "err" => Kind::Err,
        _ if k.starts_with("h?<") => Kind::Handle {
            kind: angle(k, "h?")?.into(),
            nullable: true,
        },
        _ if k.starts_with("h<") => Kind::Handle {
            kind: angle(k, "h")?.into(),
            nullable: false,
        },
        _ if k.starts_with("hs<") => Kind::Handles {
            kind: angle(k, "hs")?.into(),
            count: bracket(k)?.into(),
        },
        _ if k.starts_with("outh<") => Kind::OutHandles {
            kind: angle(k, "outh")?.into(),
            count: bracket(k)?.into(),
        },
        _ if k.starts_with("newh<") => Kind::NewHandle {
            kind: angle(k, "newh")?.into(),
        },
        _ if k.starts_with("cb<") => {
            let inner = angle(k, "cb")?;
            let (kind, owner) = inner
                .split_once(':')
                .ok_or("callbacks are written cb<kind:owner>")?;
            Kind::Callback {
                kind: kind.into(),
                owner: owner.into(),
            }
        }
        _ if k.starts_with("in_usize?[") => Kind::InUsize {
            count: parse_len(bracket(k)?)?,
            nullable: true,
        },
        _ if k.starts_with("in_usize[") => Kind::InUsize {
            count: parse_len(bracket(k)?)?,
            nullable: false,
        },
        _ if k.starts_with("in[") => Kind::In {
            len: parse_len(bracket(k)?)?,
        },
        _ if k.starts_with("dev[") => Kind::Device {
            len: parse_len(bracket(k)?)?,
        },
        _ if k.starts_with("out[") => Kind::Out {
            len: parse_len(bracket(k)?)?,
        },
        _ if k.starts_with("strs[") => Kind::Strs {
            count: bracket(k)?.into(),
        },
        _ => return Err(format!("unknown parameter kind `{k}`")),
    })
}

/// Cross-checks one entry: lengths name real parameters, callbacks have user data, kinds exist.
fn validate(api: &Api, f: &Func) -> Result<(), String> {
    let has = |n: &str| f.params.iter().any(|p| p.name == n);
    let check_len = |l: &Len| match l {
        Len::Param(p) | Len::Mul(p, _) if !has(p) => Err(format!("length names unknown `{p}`")),
        _ => Ok(()),
    };
    for (i, p) in f.params.iter().enumerate() {
        match &p.kind {
            Kind::Handle { kind, .. }
            | Kind::NewHandle { kind }
            | Kind::Handles { kind, .. }
            | Kind::OutHandles { kind, .. }
                if api.handle(kind).is_none() =>
            {
                return Err(format!("unknown handle kind `{kind}`"));
            }
            _ => {}
        }
        match &p.kind {
            Kind::Handles { count, .. } | Kind::OutHandles { count, .. } | Kind::Strs { count }
                if !has(count) && count.parse::<u32>().is_err() =>
            {
                return Err(format!("count names unknown `{count}`"));
            }
            Kind::In { len }
            | Kind::Out { len }
            | Kind::Device { len }
            | Kind::InUsize { count: len, .. } => check_len(len)?,
            Kind::Callback { kind, owner } => {
                if !api.callbacks.iter().any(|(k, _)| k == kind) {
                    return Err(format!("unknown callback kind `{kind}`"));
                }
                if owner != "none" && owner != "ret" && !has(owner) {
                    return Err(format!("callback owner `{owner}` is not a parameter"));
                }
                if !matches!(f.params.get(i + 1).map(|p| &p.kind), Some(Kind::UserData)) {
                    return Err("a callback must be followed by its user data".into());
                }
            }
            _ => {}
        }
    }
    if matches!(f.ret, Ret::Handle(_)) && !f.params.iter().any(|p| matches!(p.kind, Kind::Err)) {
        return Err("a function returning a handle needs an `err` parameter".into());
    }
    Ok(())
}

impl Func {
    /// Whether a wire stub and a server handler are generated for it.
    pub fn is_generated(&self) -> bool {
        self.mode == Mode::Gen
    }
}
