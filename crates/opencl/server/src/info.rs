//! Info queries. The server always learns the value's full size first (the two-call protocol),
//! then rewrites what the client must see differently: handles become session ids, forwarded
//! device names are marked, and capabilities Wormhole does not forward are hidden.

use crate::session::{Handle, Session};
use std::ffi::c_void;
use wormhole_opencl_proto::info::{info_value, write_answer, InfoValue};
use wormhole_opencl_proto::{cl::*, extensions, Op, Writer};

/// Prefix of forwarded device names (`WORMHOLE_NAME_PREFIX` overrides it; empty disables).
pub fn name_prefix() -> String {
    std::env::var("WORMHOLE_NAME_PREFIX").unwrap_or_else(|_| "Wormhole \u{2192} ".to_string())
}

/// Runs an info query and replies with the status, the whole value and its size (the client
/// applies the caller's buffer size, and may cache the answer).
pub fn query(
    s: &Session,
    w: &mut Writer,
    op: Op,
    param: u32,
    obj: Handle,
    call: impl Fn(usize, *mut c_void, *mut usize) -> i32,
) -> Result<(), i32> {
    let kind = info_value(op, param);
    let (value, reported) = if kind == InfoValue::Binaries {
        binaries(obj)?
    } else {
        let mut buf = crate::rt::info_bytes(&call)?;
        rewrite(s, op, param, obj, kind, &mut buf);
        let n = buf.len();
        (buf, n)
    };
    write_answer(w, &value, reported);
    Ok(())
}

fn rewrite(s: &Session, op: Op, param: u32, obj: Handle, kind: InfoValue, buf: &mut Vec<u8>) {
    match kind {
        InfoValue::Handles(k) => {
            for c in buf.chunks_exact_mut(8) {
                let p = u64::from_le_bytes(c.try_into().unwrap_or([0; 8])) as Handle;
                c.copy_from_slice(&s.export(k, p).to_le_bytes());
            }
        }
        InfoValue::ContextProps => crate::props::export_context_props(s, buf),
        _ => {}
    }
    match (op, param) {
        (Op::clGetDeviceInfo, CL_DEVICE_NAME) => {
            let mut named = name_prefix().into_bytes();
            named.extend_from_slice(buf);
            *buf = named;
        }
        // Buffer SVM is forwarded (custom/svm.rs; fine-grained buffers are coherent at
        // synchronisation points); SVM atomics would need memory both processes see coherently
        // at every instant, so they are not advertised.
        (Op::clGetDeviceInfo, CL_DEVICE_SVM_CAPABILITIES) if buf.len() == 8 => {
            let v = u64::from_le_bytes(buf[..8].try_into().unwrap_or([0; 8]))
                & (CL_DEVICE_SVM_COARSE_GRAIN_BUFFER | CL_DEVICE_SVM_FINE_GRAIN_BUFFER);
            buf.copy_from_slice(&v.to_le_bytes());
        }
        // A program whose build the program cache served answers these as the program built
        // from source would (custom/program.rs).
        (Op::clGetProgramInfo, CL_PROGRAM_SOURCE)
        | (Op::clGetProgramBuildInfo, CL_PROGRAM_BUILD_LOG) => {
            if let Some(v) = crate::custom::cached_program_answer(s, obj, param) {
                *buf = v;
            }
            // A build that read its headers elsewhere names the application's directories.
            if let Some(v) = crate::custom::build_paths_answer(s, obj, param, buf) {
                *buf = v;
            }
        }
        (Op::clGetProgramBuildInfo, CL_PROGRAM_BUILD_OPTIONS) => {
            if let Some(v) = crate::custom::build_paths_answer(s, obj, param, buf) {
                *buf = v;
            }
        }
        // The worker's pinned staging holds references the application never made.
        (Op::clGetContextInfo, CL_CONTEXT_REFERENCE_COUNT) if buf.len() == 4 => {
            if let Some(v) = crate::staging::visible_refs(obj) {
                buf.copy_from_slice(&v.to_le_bytes());
            }
        }
        (Op::clGetMemObjectInfo, CL_MEM_FLAGS) if buf.len() == 8 => {
            let v = u64::from_le_bytes(buf[..8].try_into().unwrap_or([0; 8]));
            buf.copy_from_slice(&crate::arena::visible_flags(obj, v).to_le_bytes());
        }
        // An extension whose host commands the client lacks is not advertised: the
        // application would find it listed and its functions missing.
        (Op::clGetPlatformInfo, CL_PLATFORM_EXTENSIONS)
        | (Op::clGetDeviceInfo, CL_DEVICE_EXTENSIONS) => offered_extension_names(buf),
        (Op::clGetPlatformInfo, CL_PLATFORM_EXTENSIONS_WITH_VERSION)
        | (Op::clGetDeviceInfo, CL_DEVICE_EXTENSIONS_WITH_VERSION) => offered_name_versions(buf),
        // Native kernels would run client code in the server: not forwarded (README).
        (Op::clGetDeviceInfo, CL_DEVICE_EXECUTION_CAPABILITIES) if buf.len() == 8 => {
            let v =
                u64::from_le_bytes(buf[..8].try_into().unwrap_or([0; 8])) & !CL_EXEC_NATIVE_KERNEL;
            buf.copy_from_slice(&v.to_le_bytes());
        }
        _ => {}
    }
}

/// A space-separated, NUL-terminated extension string without the extensions Wormhole does
/// not offer (`wormhole_opencl_proto::extensions`).
fn offered_extension_names(buf: &mut Vec<u8>) {
    let text = buf.strip_suffix(&[0]).unwrap_or(buf);
    let kept: Vec<&[u8]> = text
        .split(|b| *b == b' ')
        .filter(|name| !name.is_empty() && extensions::extension_is_offered(name))
        .collect();
    let mut out = kept.join(&b' ');
    out.push(0);
    *buf = out;
}

/// An array of `cl_name_version` without the extensions Wormhole does not offer.
fn offered_name_versions(buf: &mut Vec<u8>) {
    if !buf.len().is_multiple_of(CL_NAME_VERSION_SIZE) {
        return; // not the layout this code knows: left as the driver gave it
    }
    let kept: Vec<u8> = buf
        .chunks_exact(CL_NAME_VERSION_SIZE)
        .filter(|entry| {
            let name = &entry[4..];
            let name = &name[..name.iter().position(|b| *b == 0).unwrap_or(name.len())];
            extensions::extension_is_offered(name)
        })
        .flatten()
        .copied()
        .collect();
    *buf = kept;
}

/// CL_PROGRAM_BINARIES: the value is an array of pointers into the caller's memory. The server
/// fetches every binary and sends `count u32, (len u64, bytes)*`; the client scatters them.
fn binaries(program: Handle) -> Result<(Vec<u8>, usize), i32> {
    let bins = crate::rt::program_binaries(program)?;
    let mut packed = Writer::new(0);
    packed.u32(bins.len() as u32);
    for b in &bins {
        packed.bytes(b);
    }
    // Only the body travels, inside the reply (whose size the reply's own frame checks).
    Ok((packed.body().to_vec(), bins.len() * 8))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extensions_without_their_host_commands_are_not_advertised() {
        let mut names =
            b"cl_khr_fp64 cl_khr_command_buffer  cl_khr_icd cl_pocl_content_size \0".to_vec();
        offered_extension_names(&mut names);
        assert_eq!(names, b"cl_khr_fp64 cl_khr_icd\0");

        let entry = |version: u32, name: &str| {
            let mut e = version.to_le_bytes().to_vec();
            let mut n = name.as_bytes().to_vec();
            n.resize(64, 0);
            e.extend(n);
            e
        };
        let mut versions = [
            entry(1 << 22, "cl_khr_fp64"),
            entry(0x9000, "cl_khr_command_buffer"),
            entry(1 << 22, "cl_khr_subgroups"),
        ]
        .concat();
        offered_name_versions(&mut versions);
        assert_eq!(
            versions,
            [
                entry(1 << 22, "cl_khr_fp64"),
                entry(1 << 22, "cl_khr_subgroups")
            ]
            .concat()
        );
    }
}
