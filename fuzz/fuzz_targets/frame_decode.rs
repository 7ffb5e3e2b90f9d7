//! Frame headers and body decoding driven by hostile bytes: every accessor must fail cleanly.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wormhole_wire::{FrameHeader, Reader, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if data.len() >= HEADER_LEN {
        let h: [u8; HEADER_LEN] = data[..HEADER_LEN].try_into().unwrap();
        let _ = FrameHeader::decode(&h);
    }
    // Use the first byte as a script of reads over the rest.
    let Some((script, body)) = data.split_first() else { return };
    let mut r = Reader::new(body);
    for step in 0..64u32 {
        let ok = match (script.wrapping_add(step as u8)) % 9 {
            0 => r.u8().is_ok(),
            1 => r.bool().is_ok(),
            2 => r.u32().is_ok(),
            3 => r.u64().is_ok(),
            4 => r.bytes().is_ok(),
            5 => r.opt_u64s().is_ok(),
            6 => r.opt_cstring().is_ok(),
            7 => r.opt_cstrings().is_ok(),
            _ => r.usize().is_ok(),
        };
        if !ok {
            break;
        }
    }
    let _ = r.finish();
});
