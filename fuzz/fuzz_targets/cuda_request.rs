//! A whole CUDA request, as a worker receives it from a client, against the real driver where
//! there is one (none in CI: then every call the checks let through answers "not supported"):
//! decoding, validation, handle and device-range checks must turn any input into a status or
//! a clean "malformed" verdict, never a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    wormhole_cuda_server::fuzz_request(data);
});
