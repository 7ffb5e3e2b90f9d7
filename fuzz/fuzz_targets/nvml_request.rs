//! A whole NVML request, as a worker receives it from a client, against the real NVML where
//! there is one (none in CI: then every call the checks let through answers "not supported"):
//! decoding, validation and device-handle checks must turn any input into a status or a clean
//! "malformed" verdict, never a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    wormhole_nvml_server::fuzz_request(data);
});
