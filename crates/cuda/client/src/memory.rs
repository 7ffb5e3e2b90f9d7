//! Entry points that need to know which addresses are device memory (see `allocations`):
//! allocation and free (which keep the table), address ranges, copies between two plain
//! addresses (`cuMemcpy`: the direction follows from the table), and pointer attributes (the
//! server's driver answers for device addresses; for anything else it is asked about an
//! address it does not know either, and answers what CUDA answers for such memory).

// Entry points keep the C names of the functions they stand for.
#![allow(non_snake_case)]

use crate::allocations;
use crate::copies;
use crate::generated::{self, Handle};
use crate::host_memory_pinned;
use crate::objects;
use crate::rt::{self, entry_status, ApiErr};
use std::ffi::c_void;
use wormhole_cuda_proto::cu::*;
use wormhole_cuda_proto::requests::{
    mempool_attribute_size, Message, PointerAttributes, PointerValues, MAX_POINTER_ATTRIBUTES,
    POINTER_ATTRIBUTE_CONTEXT, POINTER_ATTRIBUTE_DEVICE_POINTER, POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
};
use wormhole_cuda_proto::{HandleKind, Op};
use wormhole_session::host_memory;

/// `cuMemAlloc_v2`: the allocation is noted.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemAlloc_v2(dptr: *mut u64, bytesize: usize) -> i32 {
    // SAFETY: per the contract.
    let status = unsafe { generated::wire_cuMemAlloc_v2(dptr, bytesize) };
    if status == CUDA_SUCCESS && !dptr.is_null() {
        // SAFETY: the call succeeded, so it wrote the address.
        allocations::allocated(unsafe { *dptr }, bytesize as u64);
    }
    status
}

/// `cuMemAllocPitch_v2`: noted as pitch × height bytes.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemAllocPitch_v2(
    dptr: *mut u64,
    pitch: *mut usize,
    width: usize,
    height: usize,
    element_size: u32,
) -> i32 {
    // SAFETY: per the contract.
    let status =
        unsafe { generated::wire_cuMemAllocPitch_v2(dptr, pitch, width, height, element_size) };
    if status == CUDA_SUCCESS && !dptr.is_null() && !pitch.is_null() {
        // SAFETY: the call succeeded, so it wrote both.
        let bytes = unsafe { *pitch as u64 }.saturating_mul(height as u64);
        // SAFETY: as above.
        allocations::allocated(unsafe { *dptr }, bytes);
    }
    status
}

/// `cuMemFree_v2`: the allocation is forgotten.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemFree_v2(dptr: u64) -> i32 {
    allocations::free_with(dptr, || {
        // SAFETY: a value parameter.
        unsafe { generated::wire_cuMemFree_v2(dptr) }
    })
}

/// `cuMemMap`: the mapped range is device memory of the program's from now on (virtual
/// memory management: PyTorch's expandable segments map their handles side by side in one
/// reservation).
///
/// # Safety
/// As the C function (value parameters only).
pub unsafe fn cuMemMap(ptr: u64, size: usize, offset: usize, handle: u64, flags: u64) -> i32 {
    // SAFETY: value parameters.
    let status = unsafe { generated::wire_cuMemMap(ptr, size, offset, handle, flags) };
    if status == CUDA_SUCCESS {
        allocations::allocated(ptr, size as u64);
    }
    status
}

/// `cuMemUnmap`: the mappings in the range are forgotten.
///
/// # Safety
/// As the C function (value parameters only).
pub unsafe fn cuMemUnmap(ptr: u64, size: usize) -> i32 {
    allocations::forget_within_with(ptr, size as u64, || {
        // SAFETY: value parameters.
        unsafe { generated::wire_cuMemUnmap(ptr, size) }
    })
}

/// `cuMemAddressFree`: what was still mapped in the reservation goes with it.
///
/// # Safety
/// As the C function (value parameters only).
pub unsafe fn cuMemAddressFree(ptr: u64, size: usize) -> i32 {
    allocations::forget_within_with(ptr, size as u64, || {
        // SAFETY: value parameters.
        unsafe { generated::wire_cuMemAddressFree(ptr, size) }
    })
}

/// `cuMemAllocAsync`: noted as `cuMemAlloc_v2` (usable in stream order; the address is
/// known at once).
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemAllocAsync(dptr: *mut u64, bytesize: usize, stream: Handle) -> i32 {
    // SAFETY: per the contract.
    let status = unsafe { generated::wire_cuMemAllocAsync(dptr, bytesize, stream) };
    if status == CUDA_SUCCESS && !dptr.is_null() {
        // SAFETY: the call succeeded, so it wrote the address.
        allocations::allocated(unsafe { *dptr }, bytesize as u64);
    }
    status
}

/// `cuMemAllocAsync_ptsz`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemAllocAsync_ptsz(dptr: *mut u64, bytesize: usize, stream: Handle) -> i32 {
    // SAFETY: per the contract.
    let status = unsafe { generated::wire_cuMemAllocAsync_ptsz(dptr, bytesize, stream) };
    if status == CUDA_SUCCESS && !dptr.is_null() {
        // SAFETY: the call succeeded, so it wrote the address.
        allocations::allocated(unsafe { *dptr }, bytesize as u64);
    }
    status
}

/// `cuMemFreeAsync`: forgotten as by `cuMemFree_v2` (the program may not name it again).
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemFreeAsync(dptr: u64, stream: Handle) -> i32 {
    allocations::free_with(dptr, || {
        // SAFETY: value parameters.
        unsafe { generated::wire_cuMemFreeAsync(dptr, stream) }
    })
}

/// `cuMemFreeAsync_ptsz`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemFreeAsync_ptsz(dptr: u64, stream: Handle) -> i32 {
    allocations::free_with(dptr, || {
        // SAFETY: value parameters.
        unsafe { generated::wire_cuMemFreeAsync_ptsz(dptr, stream) }
    })
}

/// `cuMemGetAddressRange_v2`: the allocation `dptr` lies in.
///
/// # Safety
/// `pbase` NULL or a writable `CUdeviceptr`, `psize` NULL or a writable `size_t`.
pub unsafe fn cuMemGetAddressRange_v2(pbase: *mut c_void, psize: *mut c_void, dptr: u64) -> i32 {
    entry_status(|| {
        rt::check_initialized()?;
        let (base, size) = allocations::range_of(dptr).ok_or(ApiErr(CUDA_ERROR_NOT_FOUND))?;
        // SAFETY: per the contract.
        unsafe {
            if !pbase.is_null() {
                *(pbase as *mut u64) = base;
            }
            if !psize.is_null() {
                *(psize as *mut usize) = size as usize;
            }
        }
        Ok(CUDA_SUCCESS)
    })
}

/// Which of the four copies a copy between two plain addresses is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    HostToHost,
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
}

fn direction(dst: u64, src: u64) -> Direction {
    let device = |a| allocations::range_of(a).is_some();
    match (device(dst), device(src)) {
        (false, false) => Direction::HostToHost,
        (true, false) => Direction::HostToDevice,
        (false, true) => Direction::DeviceToHost,
        (true, true) => Direction::DeviceToDevice,
    }
}

/// Host to host: the client's own copy. No device work can touch the program's ordinary
/// memory, so nothing on a stream has to come first; page-locked memory of the session's
/// arena the device reaches (async copies land there, kernels write it), so a copy from or to
/// it waits first for the stream it is ordered on (`stream`, NULL: the legacy one, or the
/// thread's own where `per_thread`). A source the program does not have is refused, not read.
///
/// # Safety
/// `dst` must hold `n` writable bytes; `stream` NULL or a handle of the program's.
unsafe fn host_copy(
    dst: u64,
    src: u64,
    n: usize,
    stream: Handle,
    per_thread: bool,
) -> Result<i32, ApiErr> {
    rt::check_initialized()?;
    let in_arena = |at: u64| host_memory_pinned::arena_offset(at, n as u64).is_some();
    if n > 0 && (in_arena(src) || in_arena(dst)) {
        // SAFETY: per the contract.
        let st = unsafe { rt::sync_stream(stream, per_thread) };
        if st != CUDA_SUCCESS {
            return Ok(st);
        }
    }
    // SAFETY: copy_in checks that the program has the source range.
    let bytes = unsafe { host_memory::copy_in(src as *const u8, n) }
        .ok_or(ApiErr(CUDA_ERROR_INVALID_VALUE))?;
    // SAFETY: per the contract; `bytes` is a copy, so the ranges may overlap.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), dst as *mut u8, n) };
    Ok(CUDA_SUCCESS)
}

/// `cuMemcpy`: the direction from the addresses.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemcpy(dst: u64, src: u64, n: usize) -> i32 {
    // SAFETY: per the contract, for each direction.
    unsafe {
        match direction(dst, src) {
            Direction::HostToHost => {
                entry_status(|| host_copy(dst, src, n, std::ptr::null_mut(), false))
            }
            Direction::HostToDevice => copies::cuMemcpyHtoD_v2(dst, src as *const c_void, n),
            Direction::DeviceToHost => copies::cuMemcpyDtoH_v2(dst as *mut c_void, src, n),
            Direction::DeviceToDevice => generated::wire_cuMemcpyDtoD_v2(dst, src, n),
        }
    }
}

/// `cuMemcpy_ptds`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemcpy_ptds(dst: u64, src: u64, n: usize) -> i32 {
    // SAFETY: per the contract, for each direction.
    unsafe {
        match direction(dst, src) {
            Direction::HostToHost => {
                entry_status(|| host_copy(dst, src, n, std::ptr::null_mut(), true))
            }
            Direction::HostToDevice => copies::cuMemcpyHtoD_v2_ptds(dst, src as *const c_void, n),
            Direction::DeviceToHost => copies::cuMemcpyDtoH_v2_ptds(dst as *mut c_void, src, n),
            Direction::DeviceToDevice => generated::wire_cuMemcpyDtoD_v2_ptds(dst, src, n),
        }
    }
}

/// `cuMemcpyAsync`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemcpyAsync(dst: u64, src: u64, n: usize, stream: Handle) -> i32 {
    // SAFETY: per the contract, for each direction.
    unsafe {
        match direction(dst, src) {
            Direction::HostToHost => entry_status(|| {
                rt::id_of(stream, HandleKind::Stream, true)?;
                host_copy(dst, src, n, stream, false)
            }),
            Direction::HostToDevice => {
                copies::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, n, stream)
            }
            Direction::DeviceToHost => {
                copies::cuMemcpyDtoHAsync_v2(dst as *mut c_void, src, n, stream)
            }
            Direction::DeviceToDevice => generated::wire_cuMemcpyDtoDAsync_v2(dst, src, n, stream),
        }
    }
}

/// `cuMemcpyAsync_ptsz`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemcpyAsync_ptsz(dst: u64, src: u64, n: usize, stream: Handle) -> i32 {
    // SAFETY: per the contract, for each direction.
    unsafe {
        match direction(dst, src) {
            Direction::HostToHost => entry_status(|| {
                rt::id_of(stream, HandleKind::Stream, true)?;
                host_copy(dst, src, n, stream, true)
            }),
            Direction::HostToDevice => {
                copies::cuMemcpyHtoDAsync_v2_ptsz(dst, src as *const c_void, n, stream)
            }
            Direction::DeviceToHost => {
                copies::cuMemcpyDtoHAsync_v2_ptsz(dst as *mut c_void, src, n, stream)
            }
            Direction::DeviceToDevice => {
                generated::wire_cuMemcpyDtoDAsync_v2_ptsz(dst, src, n, stream)
            }
        }
    }
}

/// Asks the server for attributes of `ptr`: the address itself where it is device memory of
/// the program's, else 0 (the server's driver then answers for an address it does not know).
fn ask(ptr: u64, single: bool, attributes: Vec<u32>) -> Result<PointerValues, ApiErr> {
    rt::check_initialized()?;
    if let Some(a) = attributes
        .iter()
        .find(|a| **a == POINTER_ATTRIBUTE_MEMPOOL_HANDLE)
    {
        crate::connection::log(&format!(
            "pointer attribute {a} (a memory pool) is not forwarded: pools are not; returning CUDA_ERROR_NOT_SUPPORTED"
        ));
        return Err(ApiErr(CUDA_ERROR_NOT_SUPPORTED));
    }
    let pinned = match allocations::range_of(ptr) {
        // Device memory first, as `direction` decides.
        Some(_) => None,
        None => host_memory_pinned::range_of(ptr),
    };
    if let Some((start, pinned)) = pinned {
        // cuda.h: "If there exists no device pointer value through which kernels running in
        // the current CUcontext may access ptr then CUDA_ERROR_INVALID_VALUE is returned" (by
        // the one-attribute query; the many-attribute one answers NULL).
        if single && attributes == [POINTER_ATTRIBUTE_DEVICE_POINTER] && !pinned.mapped() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        // Page-locked memory of the program's: answered here (the server's driver does not
        // know it), each attribute as the driver writes it.
        let values = attributes
            .iter()
            .map(|&a| {
                host_memory_pinned::attribute(ptr, start, &pinned, a).ok_or_else(|| {
                    crate::connection::log(&format!(
                        "pointer attribute {a} of page-locked host memory is not known to Wormhole; returning CUDA_ERROR_NOT_SUPPORTED"
                    ));
                    ApiErr(CUDA_ERROR_NOT_SUPPORTED)
                })
            })
            .collect::<Result<_, _>>()?;
        return Ok(PointerValues {
            status: CUDA_SUCCESS,
            values,
        });
    }
    let op = match single {
        true => Op::cuPointerGetAttribute,
        false => Op::cuPointerGetAttributes,
    };
    let request = PointerAttributes {
        ptr: allocations::range_of(ptr).map_or(0, |_| ptr),
        single,
        attributes,
    };
    let mut w = rt::request(op);
    request.encode(&mut w);
    let reply = PointerValues::decode_all(&rt::call(w)?)?;
    if reply.status == CUDA_SUCCESS && reply.values.len() != request.attributes.len() {
        crate::connection::log("the server answered another number of pointer attributes");
        return Err(ApiErr(CUDA_ERROR_UNKNOWN));
    }
    Ok(reply)
}

/// Writes one attribute's value as the driver wrote it (a context as the program's handle).
///
/// # Safety
/// `data` must hold what the driver would write there for `attribute`.
unsafe fn write_value(data: *mut c_void, attribute: u32, value: &[u8]) {
    if attribute == POINTER_ATTRIBUTE_CONTEXT && value.len() == 8 {
        let id = u64::from_le_bytes(value.try_into().expect("8 bytes"));
        // SAFETY: per the contract: a CUcontext.
        unsafe { *(data as *mut *mut c_void) = objects::object_for_id(HandleKind::Context, id) };
        return;
    }
    // SAFETY: per the contract: the driver writes this many bytes there.
    unsafe { std::ptr::copy_nonoverlapping(value.as_ptr(), data as *mut u8, value.len()) };
}

/// `CU_POINTER_ATTRIBUTE_DEVICE_POINTER` of a pointer into device memory the program
/// allocated since a context last ended, with a context current: the pointer itself (unified
/// addressing: kernels of its context reach it at the same address). Triton's launcher asks
/// this of every pointer argument at every launch, which would be a round trip each. None:
/// the driver is asked.
fn own_device_pointer(attribute: u32, ptr: u64) -> Option<u64> {
    (attribute == POINTER_ATTRIBUTE_DEVICE_POINTER
        && rt::answerable_here()
        && crate::current::known().is_some_and(|c| !c.is_null())
        && allocations::surely_live(ptr))
    .then_some(ptr)
}

/// `cuPointerGetAttribute`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuPointerGetAttribute(data: *mut c_void, attribute: u32, ptr: u64) -> i32 {
    entry_status(|| {
        if data.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        if let Some(device_pointer) = own_device_pointer(attribute, ptr) {
            // SAFETY: per the contract: a CUdeviceptr.
            unsafe { *(data as *mut u64) = device_pointer };
            return Ok(CUDA_SUCCESS);
        }
        let reply = ask(ptr, true, vec![attribute])?;
        if reply.status == CUDA_SUCCESS {
            // SAFETY: per the contract.
            unsafe { write_value(data, attribute, &reply.values[0]) };
        }
        Ok(reply.status)
    })
}

/// `cuPointerGetAttributes`.
///
/// # Safety
/// As the C function.
pub unsafe fn cuPointerGetAttributes(
    num_attributes: u32,
    attributes: *mut c_void,
    data: *mut c_void,
    ptr: u64,
) -> i32 {
    entry_status(|| {
        let n = num_attributes as usize;
        if n == 0 || n > MAX_POINTER_ATTRIBUTES || attributes.is_null() || data.is_null() {
            return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
        }
        // SAFETY: per the contract: `n` attributes and `n` data pointers.
        let (list, slots) = unsafe {
            (
                std::slice::from_raw_parts(attributes as *const u32, n).to_vec(),
                std::slice::from_raw_parts(data as *const *mut c_void, n),
            )
        };
        let reply = ask(ptr, false, list.clone())?;
        if reply.status == CUDA_SUCCESS {
            for ((slot, attribute), value) in slots.iter().zip(&list).zip(&reply.values) {
                if !slot.is_null() {
                    // SAFETY: per the contract.
                    unsafe { write_value(*slot, *attribute, value) };
                }
            }
        }
        Ok(reply.status)
    })
}

/// The width of a pool attribute's value, which the program passes at `value`: an attribute
/// of cuda.h 13.0 and a value are needed (the driver's `CUDA_ERROR_INVALID_VALUE`, after the
/// initialisation check, otherwise; an unknown attribute with a log line).
fn pool_value_width(attr: u32, value_is_null: bool) -> Result<usize, ApiErr> {
    rt::check_initialized()?;
    let Some(size) = mempool_attribute_size(attr) else {
        crate::connection::log(&format!(
            "memory pool attribute {attr} is not one of cuda.h 13.0's; answering CUDA_ERROR_INVALID_VALUE"
        ));
        return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
    };
    if value_is_null {
        return Err(ApiErr(CUDA_ERROR_INVALID_VALUE));
    }
    Ok(size)
}

/// `cuMemPoolGetAttribute`: the driver's value, written at the width of the attribute's type
/// (an `int` attribute's caller gave four bytes).
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemPoolGetAttribute(pool: Handle, attr: u32, value: *mut c_void) -> i32 {
    entry_status(|| {
        let size = pool_value_width(attr, value.is_null())?;
        let mut wide = [0u8; 8];
        // SAFETY: an 8-byte output.
        let st =
            unsafe { generated::wire_cuMemPoolGetAttribute(pool, attr, wide.as_mut_ptr().cast()) };
        if st == CUDA_SUCCESS {
            // SAFETY: the caller's value has the attribute's type.
            unsafe { std::ptr::copy_nonoverlapping(wide.as_ptr(), value.cast::<u8>(), size) };
        }
        Ok(st)
    })
}

/// `cuMemPoolSetAttribute`: the caller's value read at the width of the attribute's type.
///
/// # Safety
/// As the C function.
pub unsafe fn cuMemPoolSetAttribute(pool: Handle, attr: u32, value: *const c_void) -> i32 {
    entry_status(|| {
        let size = pool_value_width(attr, value.is_null())?;
        let mut wide = [0u8; 8];
        // SAFETY: the caller's value has the attribute's type.
        unsafe { std::ptr::copy_nonoverlapping(value.cast::<u8>(), wide.as_mut_ptr(), size) };
        // SAFETY: an 8-byte input.
        Ok(unsafe { generated::wire_cuMemPoolSetAttribute(pool, attr, wide.as_ptr().cast()) })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_between_plain_addresses_go_the_way_the_allocations_say() {
        allocations::allocated(0x7000_0000, 0x100);
        allocations::allocated(0x7000_1000, 0x100);
        assert_eq!(
            direction(0x7000_0010, 0x7000_1000),
            Direction::DeviceToDevice
        );
        assert_eq!(direction(0x7000_0010, 0x1234), Direction::HostToDevice);
        assert_eq!(direction(0x1234, 0x7000_00ff), Direction::DeviceToHost);
        assert_eq!(direction(0x1234, 0x7000_0100), Direction::HostToHost);
    }

    #[test]
    fn a_device_pointer_of_the_programs_own_memory_is_answered_here() {
        let _serial = crate::current::GENERATION_TEST_LOCK.lock();
        rt::set_initialized();
        allocations::allocated(0x7200_0000, 0x1000);
        let mut out = 0u64;
        let data = (&mut out as *mut u64).cast::<c_void>();
        crate::current::set(0x7777_9000 as *mut c_void);
        // SAFETY: `data` is the test's; no server: an answer means it was answered here.
        let st =
            unsafe { cuPointerGetAttribute(data, POINTER_ATTRIBUTE_DEVICE_POINTER, 0x7200_0010) };
        assert_eq!((st, out), (CUDA_SUCCESS, 0x7200_0010));
        // Not the program's device memory, or no context current: the driver's to answer.
        assert_eq!(
            own_device_pointer(POINTER_ATTRIBUTE_DEVICE_POINTER, 0x7200_1000),
            None
        );
        assert_eq!(
            own_device_pointer(POINTER_ATTRIBUTE_CONTEXT, 0x7200_0010),
            None
        );
        // Memory made before a context ended may have gone with it: the driver says.
        allocations::context_ended();
        assert_eq!(
            own_device_pointer(POINTER_ATTRIBUTE_DEVICE_POINTER, 0x7200_0010),
            None
        );
        allocations::allocated(0x7200_0000, 0x1000);
        assert_eq!(
            own_device_pointer(POINTER_ATTRIBUTE_DEVICE_POINTER, 0x7200_0010),
            Some(0x7200_0010)
        );
        crate::current::set(std::ptr::null_mut());
        assert_eq!(
            own_device_pointer(POINTER_ATTRIBUTE_DEVICE_POINTER, 0x7200_0010),
            None
        );
        crate::current::forget();
        allocations::freed(0x7200_0000);
    }
}
