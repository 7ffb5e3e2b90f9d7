//! A whole request, as a worker receives it from a client, against the real driver: decoding,
//! validation and handle resolution must turn any input into an error code or a clean
//! "malformed" verdict, never a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    wormhole_opencl_server::fuzz_request(data);
});
