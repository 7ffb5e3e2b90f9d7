use super::*;
use std::ffi::{c_char, CStr};
use wormhole_opencl_proto::{Op, Reader};

pub unsafe extern "C" fn clCreateProgramWithSource(
    context: Handle,
    count: u32,
    strings: *const *const c_char,
    lengths: *const usize,
    errcode_ret: *mut i32,
) -> Handle {
    rt::entry_handle(errcode_ret, || {
        // SAFETY: the application's handle.
        let ctx = unsafe { obj(context, HandleKind::Context) }?;
        if count == 0 || strings.is_null() {
            return Err(ClErr(CL_INVALID_VALUE));
        }
        let new_id = rt::alloc_id();
        let mut sources = Vec::with_capacity(count as usize);
        for i in 0..count as usize {
            // SAFETY: `strings` (and `lengths` if given) hold `count` entries.
            let s = unsafe { *strings.add(i) };
            if s.is_null() {
                return Err(ClErr(CL_INVALID_VALUE));
            }
            let len = if lengths.is_null() {
                0
            } else {
                // SAFETY: `lengths` holds `count` entries.
                unsafe { *lengths.add(i) }
            };
            // A zero length means NUL-terminated.
            let bytes = if len == 0 {
                // SAFETY: per the API, a NUL-terminated string.
                unsafe { CStr::from_ptr(s) }.to_bytes()
            } else {
                // SAFETY: per the API, `len` bytes.
                unsafe { std::slice::from_raw_parts(s as *const u8, len) }
            };
            sources.push(bytes);
        }
        let w = encode(
            Op::clCreateProgramWithSource,
            &req::CreateProgramWithSource {
                new_id,
                context: ctx.id,
                sources,
            },
        );
        let reply = rt::call(w)?;
        match Reader::new(&reply).i32()? {
            CL_SUCCESS => Ok(rt::new_object(HandleKind::Program, new_id)),
            e => Err(ClErr(e)),
        }
    })
}

pub unsafe extern "C" fn clCreateProgramWithBinary(
    context: Handle,
    num_devices: u32,
    device_list: *const Handle,
    lengths: *const usize,
    binaries: *const *const u8,
    binary_status: *mut i32,
    errcode_ret: *mut i32,
) -> Handle {
    rt::entry_handle(errcode_ret, || {
        // SAFETY: the application's handle.
        let ctx = unsafe { obj(context, HandleKind::Context) }?;
        if num_devices == 0 || device_list.is_null() || lengths.is_null() || binaries.is_null() {
            return Err(ClErr(CL_INVALID_VALUE));
        }
        let n = num_devices as usize;
        let new_id = rt::alloc_id();
        // SAFETY: `device_list` holds `n` devices.
        let devices =
            unsafe { rt::handle_ids(device_list, n, HandleKind::Device, CL_INVALID_DEVICE) }?;
        let mut bins = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: `lengths` and `binaries` hold `n` entries.
            let (len, b) = unsafe { (*lengths.add(i), *binaries.add(i)) };
            if len == 0 || b.is_null() {
                if !binary_status.is_null() {
                    // SAFETY: `binary_status` holds `n` entries.
                    unsafe { *binary_status.add(i) = CL_INVALID_VALUE };
                }
                return Err(ClErr(CL_INVALID_VALUE));
            }
            // SAFETY: binary `i` has `len` bytes.
            bins.push(unsafe { std::slice::from_raw_parts(b, len) });
        }
        let w = encode(
            Op::clCreateProgramWithBinary,
            &req::CreateProgramWithBinary {
                new_id,
                context: ctx.id,
                devices,
                binaries: bins,
                want_status: !binary_status.is_null(),
            },
        );
        let reply = rt::call(w)?;
        let req::CreateProgramWithBinaryReply {
            status,
            binary_status: statuses,
        } = req::CreateProgramWithBinaryReply::decode_all(&reply)?;
        if let Some(statuses) = statuses {
            // The server answers one status per binary sent, and only when asked to.
            if statuses.len() != n || binary_status.is_null() {
                return Err(ClErr(CL_OUT_OF_RESOURCES));
            }
            for (i, st) in statuses.into_iter().enumerate() {
                // SAFETY: `binary_status` holds `n` entries.
                unsafe { *binary_status.add(i) = st };
            }
        }
        match status {
            CL_SUCCESS => Ok(rt::new_object(HandleKind::Program, new_id)),
            e => Err(ClErr(e)),
        }
    })
}

/// `clBuildProgram`, forwarded as generated, after the headers the build includes from the
/// options' `-I` directories (`crate::includes`): read here, with the application's rights,
/// as a native build reads them. A server whose build may not read its own files (its build
/// sandbox) builds from these copies; one that may reads the same files itself.
pub unsafe extern "C" fn clBuildProgram(
    program: Handle,
    num_devices: u32,
    device_list: *const Handle,
    options: *const c_char,
    pfn_notify: *const c_void,
    user_data: *mut c_void,
) -> i32 {
    if !options.is_null() {
        // SAFETY: per the API, options are a C string.
        send_includes(program, unsafe { CStr::from_ptr(options) }.to_bytes(), &[]);
    }
    // Its kernels may take other arguments after it: what they accepted is forgotten, before
    // and after (a kernel made by another thread meanwhile saw either program).
    super::kernel::forget_program(program);
    // SAFETY: forwarded with the caller's guarantees; the wire call checks every argument.
    let st = unsafe {
        crate::generated::wire_clBuildProgram(
            program,
            num_devices,
            device_list,
            options,
            pfn_notify,
            user_data,
        )
    };
    super::kernel::forget_program(program);
    st
}

/// `clCompileProgram`, forwarded as generated, after the headers its `-I` options name, as
/// for `clBuildProgram`; the embedded input headers' own `#include`s are followed too.
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn clCompileProgram(
    program: Handle,
    num_devices: u32,
    device_list: *const Handle,
    options: *const c_char,
    num_input_headers: u32,
    input_headers: *const Handle,
    header_include_names: *const *const c_char,
    pfn_notify: *const c_void,
    user_data: *mut c_void,
) -> i32 {
    if !options.is_null() {
        let embedded: &[Handle] = if input_headers.is_null() {
            &[]
        } else {
            // SAFETY: per the API, `input_headers` holds `num_input_headers` programs.
            unsafe { std::slice::from_raw_parts(input_headers, num_input_headers as usize) }
        };
        // SAFETY: per the API, options are a C string.
        send_includes(
            program,
            unsafe { CStr::from_ptr(options) }.to_bytes(),
            embedded,
        );
    }
    super::kernel::forget_program(program);
    // SAFETY: forwarded with the caller's guarantees; the wire call checks every argument.
    let st = unsafe {
        crate::generated::wire_clCompileProgram(
            program,
            num_devices,
            device_list,
            options,
            num_input_headers,
            input_headers,
            header_include_names,
            pfn_notify,
            user_data,
        )
    };
    super::kernel::forget_program(program);
    st
}

/// Sends where a build of `program` with `options` looks for headers: the application's
/// working directory (relative `-I` directories are relative to it) and the headers found.
/// Only for builds with `-I` options. The headers are looked for from the program's source
/// and from the sources of the `embedded` header programs (clCompileProgram's input headers).
/// Best effort: whatever goes wrong here, the build itself answers.
fn send_includes(program: Handle, options: &[u8], embedded: &[Handle]) {
    let dirs = wormhole_opencl_proto::build_options::include_dirs(options);
    if dirs.is_empty() {
        return;
    }
    // SAFETY: the application's handle, checked.
    let Ok(obj) = (unsafe { obj(program, HandleKind::Program) }) else {
        return;
    };
    let Some(source) = program_source(program) else {
        return;
    };
    let mut sources = vec![source];
    // A bad handle among them is the compile's own error to give.
    sources.extend(embedded.iter().filter_map(|&h| program_source(h)));
    let cwd = std::env::current_dir().unwrap_or_default();
    let dirs: Vec<std::path::PathBuf> = dirs
        .iter()
        .map(|d| cwd.join(<std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(&d.dir)))
        .collect();
    let headers = crate::includes::find(&sources, &dirs);
    let files = headers
        .iter()
        .map(|h| req::IncludedFile {
            dir: h.dir,
            path: std::os::unix::ffi::OsStrExt::as_bytes(h.path.as_os_str()),
            data: h.data.as_deref(),
        })
        .collect();
    let mut w = Writer::new(wormhole_opencl_proto::control::INCLUDES);
    req::Includes {
        program: obj.id,
        cwd: std::os::unix::ffi::OsStrExt::as_bytes(cwd.as_os_str()),
        files,
    }
    .encode(&mut w);
    match rt::call(w).and_then(|r| Ok(Reader::new(&r).i32()?)) {
        Ok(CL_SUCCESS) => {}
        Ok(st) | Err(ClErr(st)) => crate::connection::log(&format!(
            "the headers a build includes were not taken ({st}); the server resolves them"
        )),
    }
}

/// The program's source (empty for programs made from binaries or IL), from the server.
fn program_source(program: Handle) -> Option<Vec<u8>> {
    let mut size = 0usize;
    // SAFETY: a size query into a local.
    let st = unsafe {
        crate::generated::wire_clGetProgramInfo(
            program,
            CL_PROGRAM_SOURCE,
            0,
            std::ptr::null_mut(),
            &mut size,
        )
    };
    if st != CL_SUCCESS || size <= 1 {
        return None;
    }
    let mut source = vec![0u8; size];
    // SAFETY: `source` holds `size` bytes.
    let st = unsafe {
        crate::generated::wire_clGetProgramInfo(
            program,
            CL_PROGRAM_SOURCE,
            size,
            source.as_mut_ptr() as *mut c_void,
            std::ptr::null_mut(),
        )
    };
    (st == CL_SUCCESS).then_some(source)
}
