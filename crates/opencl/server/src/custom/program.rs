//! Programs: creation from sources and binaries, and builds, which the program cache
//! (`crate::program_cache`) may serve from a binary another session built.

use super::*;
use crate::generated::ffi;
use crate::program_cache::{Entry, Key, ProgramCache};
use crate::session::CachedProgram;
use std::ffi::{c_char, c_void};
use std::sync::atomic::Ordering;
use wormhole_opencl_proto::requests::{self as req, Message};
use wormhole_opencl_proto::{cl::*, CallbackKind, Op, Writer};
use wormhole_server::build_sandbox::Policy::Sandboxed;

pub fn clCreateProgramWithSource(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let req::CreateProgramWithSource {
        new_id,
        context,
        sources: parts,
    } = req::CreateProgramWithSource::decode(r)?;
    r.finish()?;
    let count = parts.len();
    let mut run = || -> Result<(), i32> {
        s.check_new_id(new_id)?;
        let context = s.resolve(context, HandleKind::Context, false)?;
        crate::rt::check_slot(
            context,
            wormhole_opencl_proto::Op::clCreateProgramWithSource,
        )?;
        // A length of 0 means "NUL-terminated" to the driver: an empty part must point at a
        // NUL, not at whatever follows it in the request.
        let ptrs: Vec<*const c_char> = parts
            .iter()
            .map(|p| {
                if p.is_empty() {
                    c"".as_ptr()
                } else {
                    p.as_ptr() as *const c_char
                }
            })
            .collect();
        let lens: Vec<usize> = parts.iter().map(|p| p.len()).collect();
        let mut err = CL_SUCCESS;
        // SAFETY: `count` strings with explicit lengths, all borrowed from the request.
        let p = unsafe {
            ffi::clCreateProgramWithSource(
                context,
                count as u32,
                ptrs.as_ptr() as *mut c_void,
                lens.as_ptr() as *mut c_void,
                &mut err,
            )
        };
        w.i32(crate::rt::bind_created(
            s,
            new_id,
            HandleKind::Program,
            p,
            err,
        ));
        Ok(())
    };
    if let Err(e) = run() {
        w.i32(e);
    }
    Ok(())
}

pub fn clCreateProgramWithBinary(
    s: &Session,
    r: &mut Reader<'_>,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let req::CreateProgramWithBinary {
        new_id,
        context,
        devices,
        binaries: bins,
        want_status,
    } = req::CreateProgramWithBinary::decode(r)?;
    r.finish()?;
    let count = bins.len();
    let mut statuses = vec![CL_SUCCESS; count];
    let run = |statuses: &mut Vec<i32>| -> Result<i32, i32> {
        s.check_new_id(new_id)?;
        let context = s.resolve(context, HandleKind::Context, false)?;
        let n = devices.as_ref().map_or(0, |d| d.len());
        let devs = s.resolve_list(devices.as_deref(), n, HandleKind::Device, CL_INVALID_DEVICE)?;
        let ptrs: Vec<*const u8> = bins.iter().map(|b| b.as_ptr()).collect();
        let lens: Vec<usize> = bins.iter().map(|b| b.len()).collect();
        let mut err = CL_SUCCESS;
        // SAFETY: the device list, lengths, binaries and statuses all hold `count` entries
        // (the client sends one binary per device; the driver checks `n` against the lists).
        let p = unsafe {
            ffi::clCreateProgramWithBinary(
                context,
                n as u32,
                list_ptr(&devs) as *mut c_void,
                lens.as_ptr() as *mut c_void,
                ptrs.as_ptr() as *mut c_void,
                if want_status && count >= n {
                    statuses.as_mut_ptr() as *mut c_void
                } else {
                    std::ptr::null_mut()
                },
                &mut err,
            )
        };
        Ok(crate::rt::bind_created(
            s,
            new_id,
            HandleKind::Program,
            p,
            err,
        ))
    };
    let status = run(&mut statuses).unwrap_or_else(|e| e);
    req::CreateProgramWithBinaryReply {
        status,
        binary_status: want_status.then_some(statuses),
    }
    .encode(w);
    Ok(())
}

/// Most headers a session keeps for builds still to come (all programs together): a client
/// sends them right before its build, so more means headers no build took.
const MAX_KEPT_INCLUDES: usize = 64 << 20;

/// INCLUDES: the headers the next build of a program includes, as the application's side
/// read them; kept for that build (custom::clBuildProgram).
pub fn includes(s: &Session, r: &mut Reader<'_>, w: &mut Writer) -> Result<(), DecodeError> {
    let req = req::Includes::decode(r)?;
    r.finish()?;
    let run = || -> Result<(), i32> {
        s.resolve(req.program, HandleKind::Program, false)?;
        let sent = crate::includes::accept(&req)?;
        let mut kept = s.includes.lock().unwrap_or_else(|p| p.into_inner());
        kept.remove(&req.program);
        let size = |s: &crate::includes::Sent| {
            s.headers
                .iter()
                .map(|h| h.data.as_ref().map_or(0, |d| d.len()))
                .sum::<usize>()
        };
        if kept.values().map(size).sum::<usize>() + size(&sent) > MAX_KEPT_INCLUDES {
            tracing::warn!(
                "INCLUDES refused: headers of {} builds not yet built",
                kept.len()
            );
            return Err(CL_OUT_OF_HOST_MEMORY);
        }
        kept.insert(req.program, sent);
        Ok(())
    };
    w.i32(run().err().unwrap_or(CL_SUCCESS));
    Ok(())
}

/// clBuildProgram, through the program cache (`program_cache`) when the server has one.
pub fn clBuildProgram(
    s: &Session,
    a: crate::generated::args::clBuildProgram,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let crate::generated::args::clBuildProgram {
        program_id,
        num_devices,
        device_list_ids: device_ids,
        options_str: options,
        pfn_notify_cb: notify_cb,
    } = a;
    let run = || -> Result<i32, i32> {
        let program = s.resolve(program_id, HandleKind::Program, false)?;
        // The driver says so too, but a build the cache serves never asks it.
        if device_ids.is_none() != (num_devices == 0) {
            return Err(CL_INVALID_VALUE);
        }
        let devices = s.resolve_list(
            device_ids.as_deref(),
            num_devices as usize,
            HandleKind::Device,
            CL_INVALID_DEVICE,
        )?;
        crate::rt::check_slot(program, Op::clBuildProgram)?;
        let _building = crate::program_cache::Building::start();
        let headers = Headers::for_build(s, program_id, program, options.as_ref());
        let (notify, user_data) =
            crate::callbacks::make(CallbackKind::ProgramNotify, notify_cb, program_id);
        let options_ptr = headers.options(options.as_ref());
        let extra_reads = headers.extra_reads();
        // The application's own build, of whichever real program the id names by then.
        let build = |p: Handle| {
            compiling_reading(&extra_reads, || {
                // SAFETY: the device list holds `num_devices` live devices (or is NULL), the
                // options are a C string (or NULL); both live across the call.
                unsafe {
                    ffi::clBuildProgram(
                        p,
                        num_devices,
                        list_ptr(&devices),
                        options_ptr,
                        notify,
                        user_data,
                    )
                }
            })
        };
        let Some(cache) = crate::program_cache::get() else {
            return Ok(build(program));
        };
        let request = BuildRequest {
            id: program_id,
            program,
            devices: devices.as_deref(),
            options: options.as_ref().map_or(&[][..], |c| c.to_bytes()),
            user_data,
        };
        Ok(build_through_cache(s, cache, &request, build))
    };
    w.i32(run().unwrap_or_else(|e| e));
    Ok(())
}

/// clCompileProgram, in the build sandbox, with the headers its `-I` options name where the
/// application sees them (as clBuildProgram).
pub fn clCompileProgram(
    s: &Session,
    a: crate::generated::args::clCompileProgram,
    w: &mut Writer,
) -> Result<(), DecodeError> {
    let crate::generated::args::clCompileProgram {
        program_id,
        num_devices,
        device_list_ids,
        options_str: options,
        num_input_headers,
        input_headers_ids,
        header_include_names_strs: names,
        pfn_notify_cb: notify_cb,
    } = a;
    let run = || -> Result<i32, i32> {
        let program = s.resolve(program_id, HandleKind::Program, false)?;
        let devices = s.resolve_list(
            device_list_ids.as_deref(),
            num_devices as usize,
            HandleKind::Device,
            CL_INVALID_DEVICE,
        )?;
        let input_headers = s.resolve_list(
            input_headers_ids.as_deref(),
            num_input_headers as usize,
            HandleKind::Program,
            CL_INVALID_PROGRAM,
        )?;
        crate::rt::check_len(
            names.as_ref().map(|n| n.len()),
            Some(num_input_headers as usize),
        )?;
        let names: Option<Vec<*const c_char>> = names
            .as_ref()
            .map(|v| v.iter().map(|c| c.as_ptr()).collect());
        crate::rt::check_slot(program, Op::clCompileProgram)?;
        // Compiles that may swap the object behind an id take turns with builds.
        let _turn = s.build_lock.lock().unwrap_or_else(|p| p.into_inner());
        let served = program;
        let (notify, user_data) =
            crate::callbacks::make(CallbackKind::ProgramNotify, notify_cb, program_id);
        let program = source_of_served(s, program_id, served).inspect_err(|_| {
            crate::callbacks::program_built(user_data);
        })?;
        let headers = Headers::for_build(s, program_id, served, options.as_ref());
        let options_ptr = headers.options(options.as_ref());
        let st = compiling_reading(&headers.extra_reads(), || {
            // SAFETY: the lists hold the counts they go with (or are NULL), the options are a
            // C string (or NULL), the names C strings; all live across the call.
            unsafe {
                ffi::clCompileProgram(
                    program,
                    num_devices,
                    list_ptr(&devices),
                    options_ptr,
                    num_input_headers,
                    list_ptr(&input_headers),
                    names.as_ref().map_or(std::ptr::null(), |v| v.as_ptr()),
                    notify,
                    user_data,
                )
            }
        });
        name_the_source_again(s, program_id, served, program, st)?;
        Ok(st)
    };
    w.i32(run().unwrap_or_else(|e| e));
    Ok(())
}

/// Where a build (or compile) reads the headers its `-I` options name: from what INCLUDES
/// sent for the program (`crate::includes::redirect`), if anything. The program answers its
/// options and log as the application gave them (`BuildPaths`) until its next build.
struct Headers(Option<crate::includes::Redirect>);

impl Headers {
    fn for_build(
        s: &Session,
        program_id: u64,
        program: Handle,
        options: Option<&std::ffi::CString>,
    ) -> Headers {
        let sent = s
            .includes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&program_id);
        // The headers where the application sees them: its copies for a confined build, its
        // own directories (relative to its working directory) for one that may read them.
        let confined = wormhole_server::build_sandbox::policy() == Sandboxed;
        let redirect = match (&sent, options) {
            (Some(sent), Some(o)) => crate::includes::redirect(sent, o.to_bytes(), confined)
                .unwrap_or_else(|e| {
                    tracing::warn!("the build's headers could not be written ({e})");
                    None
                }),
            _ => None,
        };
        let mut paths = s.build_paths.lock().unwrap_or_else(|p| p.into_inner());
        match &redirect {
            Some(r) => paths.insert(program as usize, r.paths.clone()),
            None => paths.remove(&(program as usize)),
        };
        Headers(redirect)
    }

    /// The options the driver builds with: the redirected ones, else the application's.
    fn options(&self, given: Option<&std::ffi::CString>) -> *const c_char {
        match &self.0 {
            Some(r) => r.options.as_ptr(),
            None => given.map_or(std::ptr::null(), |c| c.as_ptr()),
        }
    }

    /// What the build may read beyond the sandbox's own list: the worker's copies.
    fn extra_reads(&self) -> Vec<std::path::PathBuf> {
        self.0
            .iter()
            .filter_map(|r| r.copies.as_ref())
            .flat_map(|m| m.readable.iter().cloned())
            .collect()
    }
}

struct BuildRequest<'a> {
    id: u64,
    /// The real program the id names now.
    program: Handle,
    devices: Option<&'a [Handle]>,
    options: &'a [u8],
    /// The client's build callback (from `callbacks::make`), NULL if none.
    user_data: *mut c_void,
}

/// A build the cache may serve: a program created from source, never built, built for all of
/// its devices. The cache holds one entry per device; a hit needs all of them.
///
/// On a hit, the id is pointed at a program created from the cached binaries and built (no
/// compiler runs), and the source program is kept aside (`CachedProgram`) for what only it
/// can answer. On a miss the source program is built as usual and, if every device built,
/// its binaries and logs are stored for the next session.
fn build_through_cache(
    s: &Session,
    cache: &'static ProgramCache,
    req: &BuildRequest<'_>,
    build: impl FnOnce(Handle) -> i32,
) -> i32 {
    // Builds that may swap the object behind an id take turns within the session.
    let _turn = s.build_lock.lock().unwrap_or_else(|p| p.into_inner());
    let source_program = match source_of_served(s, req.id, req.program) {
        Ok(p) => p,
        Err(st) => {
            crate::callbacks::program_built(req.user_data);
            return st;
        }
    };
    let plan = plan(source_program, req.devices, req.options);
    if let Some(plan) = &plan {
        if let Some(answer) = from_cache(s, cache, req, source_program, plan) {
            return answer;
        }
        crate::program_cache::MISSES.fetch_add(1, Ordering::Relaxed);
    }
    let st = build(source_program);
    if let Err(st) = name_the_source_again(s, req.id, req.program, source_program, st) {
        return st;
    }
    if st == CL_SUCCESS {
        if let Some(plan) = plan {
            if builds_cheaply_aside(&plan.devices) {
                store_later(cache, plan, req.options);
            } else {
                store(cache, source_program, &plan);
            }
        }
    }
    st
}

/// The devices of a build the cache can serve, the key of each, and the source they cover.
struct Plan {
    devices: Vec<Handle>,
    keys: Vec<Key>,
    source: Vec<u8>,
}

fn plan(source_program: Handle, requested: Option<&[Handle]>, options: &[u8]) -> Option<Plan> {
    let devices: Vec<Handle> = crate::rt::program_info(source_program, CL_PROGRAM_DEVICES)
        .ok()?
        .chunks_exact(8)
        .filter_map(crate::rt::handle_value)
        .collect();
    if let Some(req) = requested {
        // A build for some of the devices leaves the others unbuilt: the cache has no such
        // program to offer.
        let mut a = req.to_vec();
        let mut b = devices.clone();
        a.sort();
        a.dedup();
        b.sort();
        if a != b {
            return None;
        }
    }
    let source = crate::rt::program_info(source_program, CL_PROGRAM_SOURCE).ok()?;
    if source.iter().all(|&b| b == 0) {
        return None; // built from a binary or IL, or linked: nothing to key by
    }
    if reads_files(&source, options) {
        crate::program_cache::UNCACHEABLE.fetch_add(1, Ordering::Relaxed);
        tracing::debug!("program cache: the build reads files (#include); not cached");
        return None;
    }
    let mut keys = Vec::with_capacity(devices.len());
    for &d in &devices {
        let status =
            crate::rt::program_build_info(source_program, d, CL_PROGRAM_BUILD_STATUS).ok()?;
        if status != CL_BUILD_NONE.to_le_bytes() {
            return None; // built or compiled before: the driver's own rebuild rules apply
        }
        keys.push(crate::program_cache::key(
            &device_identity(d)?
                .iter()
                .map(Vec::as_slice)
                .collect::<Vec<_>>(),
            options,
            &source,
        ));
    }
    Some(Plan {
        devices,
        keys,
        source,
    })
}

/// Whether a build may read files beside its source: the key covers the source and the
/// options, not what a file holds, so a program built with a header that has changed since
/// would be served stale. Errs on the safe side: any identifier a file-reading directive or
/// operator is spelled with (a directive may be spliced over lines or follow `%:`), and the
/// options that name a file to read.
fn reads_files(source: &[u8], options: &[u8]) -> bool {
    const DIRECTIVES: [&[u8]; 7] = [
        b"include",
        b"include_next",
        b"import",
        b"embed",
        b"__has_include",
        b"__has_include_next",
        b"__has_embed",
    ];
    let joined = wormhole_opencl_proto::build_options::join_line_splices(source);
    let word = |c: &u8| c.is_ascii_alphanumeric() || *c == b'_';
    let in_source = joined.split(|c| !word(c)).any(|w| DIRECTIVES.contains(&w));
    let in_options = options
        .split(|c| c.is_ascii_whitespace())
        .any(|o| o.starts_with(b"-include") || o.starts_with(b"-imacros") || o.starts_with(b"@"));
    in_source || in_options
}

/// What decides whether a binary fits a device: the platform's and device's names and
/// versions and the driver's version.
fn device_identity(d: Handle) -> Option<Vec<Vec<u8>>> {
    let platform = crate::rt::handle_value(&crate::rt::device_info(d, CL_DEVICE_PLATFORM).ok()?)?;
    let mut id = Vec::new();
    for param in [CL_PLATFORM_NAME, CL_PLATFORM_VERSION] {
        id.push(crate::rt::platform_info(platform, param).ok()?);
    }
    for param in [CL_DEVICE_NAME, CL_DEVICE_VERSION, CL_DRIVER_VERSION] {
        id.push(crate::rt::device_info(d, param).ok()?);
    }
    Some(id)
}

/// Serves the build from the cache if every device's entry is there and the driver accepts
/// them; the reply status, or None to compile instead.
fn from_cache(
    s: &Session,
    cache: &ProgramCache,
    req: &BuildRequest<'_>,
    source_program: Handle,
    plan: &Plan,
) -> Option<i32> {
    cache.wait_for_stores(&plan.keys);
    let entries: Vec<Entry> = plan
        .keys
        .iter()
        .map(|k| cache.load(k))
        .collect::<Option<_>>()?;
    // One log answers CL_PROGRAM_BUILD_LOG for every device (programs for several devices
    // whose logs differ are compiled).
    if entries.windows(2).any(|w| w[0].log != w[1].log) {
        return None;
    }
    let discard = |why: &str| {
        tracing::warn!("program cache: {why}; compiling instead");
        plan.keys.iter().for_each(|k| cache.discard(k));
    };
    let context = crate::rt::handle_value(
        &crate::rt::program_info(source_program, CL_PROGRAM_CONTEXT).ok()?,
    )?;
    let binaries: Vec<&[u8]> = entries.iter().map(|e| e.binary.as_slice()).collect();
    let new = match program_from_binaries(context, plan, &binaries) {
        Ok(p) => p,
        Err(err) => {
            discard(&format!("the driver refused a cached binary ({err})"));
            return None;
        }
    };
    let st = rebuild(new, Some(&plan.devices), req.options);
    if st != CL_SUCCESS {
        release_program(new);
        discard(&format!("a cached binary did not build ({st})"));
        return None;
    }
    let keep = u32::from(source_program == req.program);
    if let Err(st) = move_references(s, req.id, req.program, new, keep) {
        release_program(new);
        crate::callbacks::program_built(req.user_data);
        return Some(st);
    }
    move_build_paths(s, req.program, new);
    let mut cached = s.cached_programs.lock().unwrap_or_else(|p| p.into_inner());
    cached.remove(&(req.program as usize));
    cached.insert(
        new as usize,
        CachedProgram {
            source_program,
            options: req.options.to_vec(),
            log: entries[0].log.clone(),
        },
    );
    drop(cached);
    crate::program_cache::HITS.fetch_add(1, Ordering::Relaxed);
    crate::callbacks::program_built(req.user_data);
    Some(CL_SUCCESS)
}

/// The program a build (or compile) of `program`, named `id`, is the driver's for: `program`
/// itself, or where the cache served its build, the source program the application made. A
/// driver may not build a program made from binaries twice (PoCL 3.1 aborts the worker:
/// `pocl_cache_buildhash_is_valid`), nor compile it; natively the application's program is
/// built again from its source, unless kernels hold it: then CL_INVALID_OPERATION, as
/// natively, and the caller calls the build's callback, as PoCL does for its own refusal.
fn source_of_served(s: &Session, id: u64, program: Handle) -> Result<Handle, i32> {
    let source = s
        .cached_programs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&(program as usize))
        .map(|c| c.source_program);
    match source {
        None => Ok(program),
        Some(source) if held_by_driver(s, id, program)? == 0 => Ok(source),
        Some(_) => Err(CL_INVALID_OPERATION),
    }
}

/// The references to `program` (named `id`) that are not the application's: its kernels',
/// those the application holds and those only the driver still does (a released kernel of a
/// command not finished yet). The session's own kernel table would miss the latter, and
/// asking each kernel there for its program races with its release on another lane.
fn held_by_driver(s: &Session, id: u64, program: Handle) -> Result<u32, i32> {
    let app = s.app_refs(id).ok_or(CL_INVALID_PROGRAM)?;
    Ok(driver_refs(program)?.saturating_sub(app))
}

/// The driver's reference count of `program`.
fn driver_refs(program: Handle) -> Result<u32, i32> {
    let count = crate::rt::program_info(program, CL_PROGRAM_REFERENCE_COUNT)?;
    Ok(u32::from_le_bytes(
        count
            .get(..4)
            .and_then(|c| c.try_into().ok())
            .unwrap_or([0; 4]),
    ))
}

/// After the driver built (or compiled) `source` in place of the served program `served`
/// (`source_of_served`) with status `st`: the id names its source program again once that
/// built, or failed to build as the application's program would have. A call the driver
/// refused before building leaves the served program behind the id, built, as natively.
fn name_the_source_again(
    s: &Session,
    id: u64,
    served: Handle,
    source: Handle,
    st: i32,
) -> Result<(), i32> {
    if source == served || (st != CL_SUCCESS && !build_attempted(source)) {
        return Ok(());
    }
    s.cached_programs
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&(served as usize));
    move_build_paths(s, served, source);
    move_references(s, id, served, source, 0)
}

/// Where a build's headers were (`Headers`, filed under the program the id named) follows the
/// id to the program it names now; nothing stays filed under one that may be freed (a later
/// program at its address would answer with it).
fn move_build_paths(s: &Session, from: Handle, to: Handle) {
    let mut paths = s.build_paths.lock().unwrap_or_else(|p| p.into_inner());
    match paths.remove(&(from as usize)) {
        Some(p) => paths.insert(to as usize, p),
        None => paths.remove(&(to as usize)),
    };
}

/// Whether a build of `program` got as far as changing its build status on some device (a
/// build refused for its arguments leaves it as it was).
fn build_attempted(program: Handle) -> bool {
    let Ok(devices) = crate::rt::program_info(program, CL_PROGRAM_DEVICES) else {
        return false;
    };
    devices
        .chunks_exact(8)
        .filter_map(crate::rt::handle_value)
        .any(|d| {
            crate::rt::program_build_info(program, d, CL_PROGRAM_BUILD_STATUS)
                .is_ok_and(|st| st != CL_BUILD_NONE.to_le_bytes())
        })
}

/// A program created from one binary per device of `plan` (not built yet), or the driver's
/// error.
fn program_from_binaries(context: Handle, plan: &Plan, binaries: &[&[u8]]) -> Result<Handle, i32> {
    if binaries.len() != plan.devices.len() {
        return Err(CL_INVALID_VALUE);
    }
    let lens: Vec<usize> = binaries.iter().map(|b| b.len()).collect();
    let bins: Vec<*const u8> = binaries.iter().map(|b| b.as_ptr()).collect();
    let mut err = CL_SUCCESS;
    // SAFETY: devices, lengths and binaries all hold `plan.devices.len()` entries.
    let p = unsafe {
        ffi::clCreateProgramWithBinary(
            context,
            plan.devices.len() as u32,
            plan.devices.as_ptr() as *mut c_void,
            lens.as_ptr() as *mut c_void,
            bins.as_ptr() as *mut c_void,
            std::ptr::null_mut(),
            &mut err,
        )
    };
    match (p.is_null(), err) {
        (false, CL_SUCCESS) => Ok(p),
        (_, CL_SUCCESS) => Err(CL_OUT_OF_RESOURCES),
        (_, e) => Err(e),
    }
}

/// Builds `program` for `devices` (all of its devices if None) with `options`, no callback.
fn rebuild(program: Handle, devices: Option<&[Handle]>, options: &[u8]) -> i32 {
    let Ok(options) = std::ffi::CString::new(options) else {
        return CL_INVALID_BUILD_OPTIONS;
    };
    let (n, list) = devices.map_or((0, std::ptr::null()), |d| (d.len() as u32, d.as_ptr()));
    compiling(|| {
        // SAFETY: `list` holds `n` live devices or is NULL; `options` is a C string.
        unsafe {
            ffi::clBuildProgram(
                program,
                n,
                list,
                options.as_ptr(),
                std::ptr::null(),
                std::ptr::null_mut(),
            )
        }
    })
}

/// Runs a driver call that compiles (and so may read files a program names) under the
/// session's build sandbox (`wormhole_server::build_sandbox`); a build the sandbox cannot
/// run answers as a driver without a compiler.
pub(crate) fn compiling(call: impl FnOnce() -> i32) -> i32 {
    compiling_reading(&[], call)
}

/// As `compiling`, the build allowed to read `extra` too.
fn compiling_reading(extra: &[std::path::PathBuf], call: impl FnOnce() -> i32) -> i32 {
    wormhole_server::build_sandbox::run_reading(extra, call).unwrap_or(CL_COMPILER_NOT_AVAILABLE)
}

/// Points `id` from program `from` to program `to`, moving the application's references
/// with it (`to` holds one already), and keeps `keep` of them on `from`. Only the
/// application's: what else holds `from` (a kernel made while the driver built, which natively
/// would have kept the build from starting) keeps it alive until it lets go.
fn move_references(s: &Session, id: u64, from: Handle, to: Handle, keep: u32) -> Result<(), i32> {
    let _repointing = s.repointing();
    let count = s.app_refs(id).ok_or(CL_INVALID_PROGRAM)?;
    if count == 0 || driver_refs(from)? < count {
        return Err(CL_INVALID_PROGRAM);
    }
    for _ in 1..count {
        // SAFETY: a live program.
        unsafe { ffi::clRetainProgram(to) };
    }
    s.rebind(id, HandleKind::Program, to);
    for _ in keep..count {
        release_program(from);
    }
    Ok(())
}

/// Whether any kernel of `program` carries source attributes (`CL_KERNEL_ATTRIBUTES` not
/// empty, or a required work-group size on one of `devices`). Some drivers keep only what a
/// kernel does in a binary, not what the source said of it (PoCL forgets `__attribute__`s),
/// so a build served from a binary would answer differently from native; such builds are not
/// cached. Asked of the compiled program itself: building from the binary to compare could
/// crash the worker where the driver cannot build its own binary back (PoCL aborts on kernel
/// names of 256 characters).
///
/// Asked before the binaries, never after: PoCL before 7.0 makes code for each kernel when
/// asked for binaries, keyed by build and work-group size like the code of a running command
/// of the same source, and a command that finishes then may give back that entry instead of
/// its own, which aborts the worker (`pocl_release_dlhandle_cache: found->ref_count > 0`;
/// fixed in PoCL by c9ac4c0c3). Only a required work-group size makes the two sizes equal.
fn kernels_have_attributes(program: Handle, devices: &[Handle]) -> bool {
    let mut n = 0u32;
    // SAFETY: a live, built program; the count goes to a local.
    if unsafe { ffi::clCreateKernelsInProgram(program, 0, std::ptr::null_mut(), &mut n) } != 0 {
        return true;
    }
    let mut kernels = vec![std::ptr::null_mut(); n as usize];
    // SAFETY: `kernels` holds `n` handles.
    let st = unsafe {
        ffi::clCreateKernelsInProgram(program, n, kernels.as_mut_ptr(), std::ptr::null_mut())
    };
    if st != 0 {
        return true;
    }
    let mut any = false;
    for &k in &kernels {
        // SAFETY: a live kernel; `info_bytes` passes a buffer of the size it gives.
        let attributes = crate::rt::info_bytes(|n, p, r| unsafe {
            ffi::clGetKernelInfo(k, CL_KERNEL_ATTRIBUTES, n, p, r)
        });
        // An error is as good as attributes: nothing to promise a binary keeps.
        any |= attributes.map_or(true, |a| a.iter().any(|&c| c != 0));
        for &d in devices {
            // SAFETY: as above, for one of the program's devices.
            let size = crate::rt::info_bytes(|n, p, r| unsafe {
                ffi::clGetKernelWorkGroupInfo(k, d, CL_KERNEL_COMPILE_WORK_GROUP_SIZE, n, p, r)
            });
            any |= size.map_or(true, |s| s.iter().any(|&c| c != 0));
        }
        // SAFETY: created above, released once.
        unsafe { ffi::clReleaseKernel(k) };
    }
    any
}

/// The longest kernel name of a program the cache stores (see `store`).
const MAX_CACHED_KERNEL_NAME: usize = 128;

/// Whether the cache's entries for these devices are made by building the program again, in
/// a context of the worker's own, on the background thread (`store_later`), rather than by
/// asking the application's program for its binaries before the build returns (`store`).
///
/// On a CPU device the binaries cost as much as the build (PoCL generates code for every
/// kernel when asked for them: one-off builds took ~75% longer with the store in the reply's
/// path) and a context costs nothing but host memory; as PoCL compiles one thing at a time,
/// the store waits for a quiet moment (`program_cache`). A GPU context holds device memory
/// no quota counts, and a GPU driver's binaries are what its build made: those devices keep
/// the store in the build. Sub-devices too (a context of ours would hold a reference to them
/// that the application could see).
fn builds_cheaply_aside(devices: &[Handle]) -> bool {
    devices.iter().all(|&d| {
        let ty = crate::rt::device_info(d, CL_DEVICE_TYPE).ok();
        let parent = crate::rt::device_info(d, CL_DEVICE_PARENT_DEVICE).ok();
        let is_cpu = ty
            .and_then(|t| t.get(..8).and_then(|b| b.try_into().ok()))
            .is_some_and(|t: [u8; 8]| u64::from_le_bytes(t) & CL_DEVICE_TYPE_CPU != 0);
        let is_root = parent
            .and_then(|p| crate::rt::handle_value(&p))
            .is_some_and(|p| p.is_null());
        is_cpu && is_root
    })
}

/// Queues the store of a successful build: the background thread builds the same source with
/// the same options for the same devices, in a context of its own, and stores that program's
/// binaries. Nothing the application holds is touched after this returns.
fn store_later(cache: &'static ProgramCache, plan: Plan, options: &[u8]) {
    let keys = plan.keys.clone();
    let devices: Vec<usize> = plan.devices.iter().map(|&d| d as usize).collect();
    let (source, options) = (plan.source, options.to_vec());
    let work = move |cache: &ProgramCache| {
        let plan = Plan {
            devices: devices.iter().map(|&d| d as Handle).collect(),
            keys: plan.keys,
            source,
        };
        let Some(context) = own_context(&plan.devices) else {
            return;
        };
        let program = match program_from_source(context, &plan.source) {
            Ok(p) => p,
            Err(e) => {
                tracing::debug!(
                    "program cache: the source did not make a program again ({e}); not stored"
                );
                return;
            }
        };
        let st = rebuild(program, Some(&plan.devices), &options);
        if st == CL_SUCCESS {
            store(cache, program, &plan);
        } else {
            tracing::debug!("program cache: the build aside failed ({st}); not stored");
        }
        release_program(program);
    };
    cache.store_later(keys, Box::new(work));
}

/// The worker's own context for a list of (root) devices, made once and kept for the worker's
/// life: a context's first build loads the compiler's libraries (~0.4 s on PoCL).
fn own_context(devices: &[Handle]) -> Option<Handle> {
    static CONTEXTS: std::sync::Mutex<Vec<(Vec<usize>, usize)>> = std::sync::Mutex::new(Vec::new());
    let wanted: Vec<usize> = devices.iter().map(|&d| d as usize).collect();
    let mut contexts = CONTEXTS.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, c)) = contexts.iter().find(|(d, _)| *d == wanted) {
        return Some(*c as Handle);
    }
    let mut err = CL_SUCCESS;
    // SAFETY: `devices` holds live root devices; no properties, no callback.
    let c = unsafe {
        ffi::clCreateContext(
            std::ptr::null(),
            devices.len() as u32,
            devices.as_ptr(),
            std::ptr::null(),
            std::ptr::null_mut(),
            &mut err,
        )
    };
    if c.is_null() || err != CL_SUCCESS {
        tracing::warn!("program cache: no context of the worker's own ({err}); not stored");
        return None;
    }
    contexts.push((wanted, c as usize));
    Some(c)
}

/// A program made from one source string in `context`, or the driver's error.
fn program_from_source(context: Handle, source: &[u8]) -> Result<Handle, i32> {
    // CL_PROGRAM_SOURCE ends with its NUL: the length given is the text's.
    let text = source.strip_suffix(&[0]).unwrap_or(source);
    let ptr = text.as_ptr() as *const c_char;
    let len = text.len();
    let mut err = CL_SUCCESS;
    // SAFETY: one string with its length, borrowed for the call.
    let p = unsafe {
        ffi::clCreateProgramWithSource(
            context,
            1,
            &ptr as *const *const c_char as *mut c_void,
            &len as *const usize as *mut c_void,
            &mut err,
        )
    };
    match (p.is_null(), err) {
        (false, CL_SUCCESS) => Ok(p),
        (_, CL_SUCCESS) => Err(CL_OUT_OF_RESOURCES),
        (_, e) => Err(e),
    }
}

/// Stores what a successful build produced, one entry per device.
fn store(cache: &ProgramCache, program: Handle, plan: &Plan) {
    // Asking for the binaries makes the driver generate code for every kernel, which the
    // application never asked for: PoCL aborts (the whole worker) where a kernel's name is too
    // long for a file name in its own cache. Such programs are simply not cached.
    let names = crate::rt::program_info(program, CL_PROGRAM_KERNEL_NAMES).unwrap_or_default();
    if names
        .split(|&c| c == b';' || c == 0)
        .any(|n| n.len() > MAX_CACHED_KERNEL_NAME)
    {
        crate::program_cache::UNCACHEABLE.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(
            "program cache: a kernel name too long for the driver's binaries; not cached"
        );
        return;
    }
    if kernels_have_attributes(program, &plan.devices) {
        crate::program_cache::UNCACHEABLE.fetch_add(1, Ordering::Relaxed);
        tracing::debug!("program cache: kernels with source attributes; not cached");
        return;
    }
    let Ok(binaries) = crate::rt::program_binaries(program) else {
        return;
    };
    if binaries.len() != plan.devices.len() {
        return;
    }
    for ((&d, key), binary) in plan.devices.iter().zip(&plan.keys).zip(binaries) {
        let status = crate::rt::program_build_info(program, d, CL_PROGRAM_BUILD_STATUS);
        let log = crate::rt::program_build_info(program, d, CL_PROGRAM_BUILD_LOG);
        // A driver that builds in the background has nothing to store yet.
        if status != Ok(CL_BUILD_SUCCESS.to_le_bytes().to_vec()) || binary.is_empty() {
            continue;
        }
        cache.store(
            key,
            &Entry {
                binary,
                log: log.unwrap_or_default(),
            },
        );
    }
}

/// What a program whose build read its headers elsewhere answers as natively (`includes`):
/// its build options as given, its log naming the application's directories.
pub(crate) fn build_paths_answer(
    s: &Session,
    program: Handle,
    param: u32,
    value: &[u8],
) -> Option<Vec<u8>> {
    let paths = s.build_paths.lock().unwrap_or_else(|p| p.into_inner());
    let p = paths.get(&(program as usize))?;
    match param {
        CL_PROGRAM_BUILD_LOG => Some(p.log(value)),
        CL_PROGRAM_BUILD_OPTIONS => {
            let mut o = p.options.clone();
            o.push(0);
            Some(o)
        }
        _ => None,
    }
}

/// The answers a program built from the cache gives as the program built from source would:
/// its source, and the log of the build the binary came from.
pub(crate) fn cached_program_answer(s: &Session, program: Handle, param: u32) -> Option<Vec<u8>> {
    let cached = s.cached_programs.lock().unwrap_or_else(|p| p.into_inner());
    let c = cached.get(&(program as usize))?;
    match param {
        CL_PROGRAM_BUILD_LOG => Some(c.log.clone()),
        // The source program is live: the session holds a reference.
        CL_PROGRAM_SOURCE => crate::rt::program_info(c.source_program, CL_PROGRAM_SOURCE).ok(),
        _ => None,
    }
}

pub(crate) fn release_program(p: Handle) {
    // SAFETY: the caller owns a reference to the live program `p`.
    unsafe { ffi::clReleaseProgram(p) };
}

#[cfg(test)]
mod tests {
    use super::reads_files;

    #[test]
    fn builds_that_may_read_files_are_recognised() {
        let plain = b"__kernel void k(__global int *a) { a[0] = 1; }";
        assert!(!reads_files(plain, b"-DN=3 -cl-fast-relaxed-math"));
        // A kernel's own words that merely contain a directive's name are not one.
        assert!(!reads_files(b"int included_count; int reimport;", b""));
        for source in [
            &b"#include \"a.h\"\n"[..],
            b"  #  include <a.h>\n",
            b"%:include \"a.h\"\n",
            b"#inc\\\nlude \"a.h\"\n",
            b"#define F \"a.h\"\n#include F\n",
            b"#if __has_include(\"a.h\")\n#endif\n",
            b"#embed \"blob\"\n",
            b"#include_next <a.h>\n",
        ] {
            assert!(
                reads_files(source, b""),
                "{}",
                String::from_utf8_lossy(source)
            );
        }
        for options in [&b"-include a.h"[..], b"-imacros m.h", b"@opts.txt"] {
            assert!(reads_files(plain, options));
        }
    }
}
