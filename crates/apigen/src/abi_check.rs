//! A C++ program that checks the description against the API's own C headers: every entry
//! point the description gives parameters must have, in the header, the same number of
//! parameters, each of the same class (pointer, or integer of the same width) and the same
//! return class. The client exports its symbols with the description's signatures and the
//! server calls the real driver with them, so a parameter described wrongly would corrupt the
//! call only on a machine with the real driver; this finds it with nothing but a compiler.
//!
//! The API's test supplies, per entry point, the C type to check against (for CUDA the
//! `PFN_<name>_v<version>` typedef of cudaTypedefs.h, which checks `@since` as well).

use crate::{Func, Kind, Len, Mode, Ret, Scalar};
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The class of a parameter of this kind in the C signature: `p` a pointer, `i4`/`i8` an
/// integer (or enum) of that many bytes.
fn class(k: &Kind) -> &'static str {
    match k {
        Kind::Scalar(Scalar::U8) => "i1",
        Kind::Scalar(Scalar::U16) => "i2",
        Kind::Scalar(Scalar::U32 | Scalar::I32) | Kind::DeviceNumber => "i4",
        Kind::Scalar(Scalar::U64 | Scalar::Usize) | Kind::Device { .. } => "i8",
        _ => "p",
    }
}

fn ret_class(r: &Ret) -> &'static str {
    match r {
        Ret::Int => "i4",
        Ret::Handle(_) | Ret::Ptr => "p",
        Ret::Void => "v",
    }
}

/// The size of what a pointer parameter of this kind points to, where the kind says: a value
/// written back (4 or 8 bytes), a handle, or a fixed length (or a count times a size): a
/// struct or an array element. A wrong one would write past the caller's variable.
fn pointee_size(k: &Kind) -> Option<u64> {
    match k {
        Kind::OutU32 | Kind::Err => Some(4),
        Kind::OutU64 | Kind::OutSize | Kind::InUsize { .. } | Kind::Props(_) => Some(8),
        Kind::Handles { .. } | Kind::OutHandles { .. } | Kind::NewHandle { .. } => Some(8),
        Kind::In { len } | Kind::Out { len } => match len {
            Len::Const(n) | Len::Mul(_, n) => Some(*n),
            Len::Param(_) => None,
        },
        _ => None,
    }
}

/// `ret(param,param,...)` as the C++ program writes a function pointer type's classes.
pub fn abi_classes(f: &Func) -> String {
    let params: Vec<&str> = f.params.iter().map(|p| class(&p.kind)).collect();
    format!("{}({})", ret_class(&f.ret), params.join(","))
}

/// Entry points whose signature the description states: forwarded, custom or local ones.
/// A refused one (`unsupported`, `absent`) is described without parameters and takes none.
fn described(f: &Func) -> bool {
    !matches!(f.mode, Mode::Unsupported | Mode::Absent)
}

/// The C++ source: `prelude` (the headers), then one check per entry point for which
/// `c_type` names a function pointer type. Described entry points are compared class by
/// class, and a fixed length against the size of what the pointer points to; for the others
/// the type must merely exist (a compile error names a missing one).
/// The program prints one line per mismatch and exits 1 if there was any.
pub fn emit_abi_check(
    funcs: &[Func],
    prelude: &str,
    c_type: &dyn Fn(&Func) -> Option<String>,
) -> String {
    let mut s = String::from(prelude);
    s.push_str(
        r#"
#include <cstdio>
#include <string>
#include <tuple>
#include <type_traits>

template <class T> std::string wh_class() {
    if constexpr (std::is_void_v<T>) return "v";
    else if constexpr (std::is_pointer_v<T>) return "p";
    else if constexpr (std::is_integral_v<T> || std::is_enum_v<T>) return "i" + std::to_string(sizeof(T));
    else if constexpr (std::is_floating_point_v<T>) return "f" + std::to_string(sizeof(T));
    else return "struct" + std::to_string(sizeof(T));
}

template <class F> struct wh_sig;
template <class R, class... A> struct wh_sig<R (*)(A...)> {
    template <std::size_t I> using arg = std::tuple_element_t<I, std::tuple<A...>>;
    static std::string classes() {
        std::string s = wh_class<R>() + "(";
        bool first = true;
        ((s += (first ? "" : ","), s += wh_class<A>(), first = false), ...);
        return s + ")";
    }
};

// The size of what parameter I points to; 0 for bytes (void, char), which any length fits.
template <class F, std::size_t I> std::size_t wh_pointee() {
    using P = typename wh_sig<F>::template arg<I>;
    using T = std::remove_cv_t<std::remove_pointer_t<P>>;
    if constexpr (!std::is_pointer_v<P> || std::is_void_v<T> || std::is_function_v<T>) return 0;
    else return sizeof(T) == 1 ? 0 : sizeof(T);
}

static int wh_check_pointee(const char *name, const char *type, int param, std::size_t header, std::size_t described) {
    if (header == 0 || header == described) return 0;
    std::printf("%s: parameter %d points to %zu bytes in the header's %s, the description says %zu\n", name, param, header, type, described);
    return 1;
}

static int wh_check(const char *name, const char *type, const std::string &header, const char *described) {
    if (header == described) return 0;
    std::printf("%s: the header's %s is %s, the description says %s\n", name, type, header.c_str(), described);
    return 1;
}

int main() {
    int mismatches = 0;
"#,
    );
    for f in funcs {
        let Some(ty) = c_type(f) else { continue };
        if described(f) {
            let _ = writeln!(
                s,
                "    mismatches += wh_check(\"{0}\", \"{1}\", wh_sig<{1}>::classes(), \"{2}\");",
                f.name,
                ty,
                abi_classes(f)
            );
            for (i, p) in f.params.iter().enumerate() {
                let Some(n) = pointee_size(&p.kind) else {
                    continue;
                };
                let _ = writeln!(
                    s,
                    "    mismatches += wh_check_pointee(\"{0}\", \"{1}\", {i}, wh_pointee<{1}, {i}>(), {n});",
                    f.name, ty
                );
            }
        } else {
            let _ = writeln!(s, "    (void)sizeof({ty}); // {}", f.name);
        }
    }
    s.push_str(
        "    std::printf(\"%d mismatches\\n\", mismatches);\n    return mismatches == 0 ? 0 : 1;\n}\n",
    );
    s
}

/// A C++ program that includes `header` and checks that each C expression (a `sizeof`, an
/// `offsetof`, a macro) has the value the Rust side uses: one line per difference, exit 1 if
/// there was any. For the structs and constants a client reads or fills itself.
pub fn emit_value_check(header: &str, checks: &[(String, u64)]) -> String {
    let mut s = format!(
        "#include <{header}>\n#include <cstddef>\n#include <cstdio>\n\nint main() {{\n    int mismatches = 0;\n"
    );
    for (expr, value) in checks {
        let _ = writeln!(
            s,
            "    if ((unsigned long long)({expr}) != {value}ull) {{ std::printf(\"{expr}: %llu in {header}, {value} here\\n\", (unsigned long long)({expr})); mismatches++; }}"
        );
    }
    s.push_str("    return mismatches == 0 ? 0 : 1;\n}\n");
    s
}

/// The directory of NVIDIA's C headers the ABI tests compile against: `WORMHOLE_CUDA_INCLUDE`,
/// else the one in the repository's virtual environment (`nvidia/cu13/include` under its
/// site-packages, where `scripts/install.sh` puts nvcc 13.0, cuda.h and nvml.h from PyPI).
pub fn nvidia_headers(repo: &Path, header: &str) -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("WORMHOLE_CUDA_INCLUDE") {
        return Ok(dir.into());
    }
    let lib = repo.join(".venv/lib");
    std::fs::read_dir(&lib)
        .ok()
        .and_then(|dirs| {
            dirs.flatten()
                .map(|d| d.path().join("site-packages/nvidia/cu13/include"))
                .find(|p| p.join(header).exists())
        })
        .ok_or_else(|| {
            format!(
                "no {header} under {}: run scripts/install.sh (it installs NVIDIA's headers \
                 from PyPI), or name a directory that has it in WORMHOLE_CUDA_INCLUDE",
                lib.display()
            )
        })
}

/// Compiles `source` (from [`emit_abi_check`]) in `dir` against the headers in `include` and
/// runs it: the mismatches it reports, or why it could not be built.
pub fn run_abi_check(source: &str, include: &Path, dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let (src, exe) = (dir.join("check.cpp"), dir.join("check"));
    std::fs::write(&src, source).map_err(|e| format!("{}: {e}", src.display()))?;
    let built = Command::new("c++")
        .args(["-std=c++17", "-fmax-errors=0", "-o"])
        .arg(&exe)
        .arg("-I")
        .arg(include)
        .arg(&src)
        .output()
        .map_err(|e| format!("cannot run the C++ compiler (c++): {e}"))?;
    if !built.status.success() {
        return Err(format!(
            "{} does not compile against {} (a type it names is not in the headers):\n{}",
            src.display(),
            include.display(),
            String::from_utf8_lossy(&built.stderr)
        ));
    }
    let ran = Command::new(&exe)
        .output()
        .map_err(|e| format!("{}: {e}", exe.display()))?;
    if ran.status.success() {
        Ok(())
    } else {
        Err(format!(
            "it reports differences:\n{}",
            String::from_utf8_lossy(&ran.stdout)
        ))
    }
}
