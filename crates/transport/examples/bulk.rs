//! Bulk throughput of the shared-memory fast path (no OpenCL): 16 MiB and 256 MiB frames through
//! one lane of the default geometry between two threads (the producer's copy into the ring
//! overlaps the consumer's copy out of it), `copy_bulk` between a buffer arena and private
//! memory (the one copy of a windowed buffer's read or write), and the copy kernel alone on
//! pieces that stay in the caches.
//! `cargo run --release -p wormhole-transport --example bulk`
use std::sync::Arc;
use std::time::Instant;
use wormhole_transport::copy::copy_bulk;
use wormhole_transport::{Arena, FutexWaiter, Layout, Region, ShmLink, SpinPolicy};

/// Rounds per size; the median is reported (the host is shared, single rounds swing).
const ROUNDS: usize = 9;

fn gbps(bytes: usize, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn link(region: &Arc<Region>, server: bool) -> ShmLink {
    let (req, rep) = region.lane(0).unwrap();
    let (tx, rx) = if server { (rep, req) } else { (req, rep) };
    ShmLink::new(
        tx,
        rx,
        Arc::new(FutexWaiter),
        SpinPolicy::default(),
        Arc::new(|| true),
    )
}

fn ring(sizes: &[usize]) {
    let region = Arc::new(
        Region::create_memfd(Layout {
            lanes: 1,
            ..Layout::default()
        })
        .unwrap(),
    );
    let peer = Arc::new(Region::open_file(region.file().try_clone().unwrap()).unwrap());
    let total: usize = sizes.len() * ROUNDS;
    let sizes_owned = sizes.to_vec();
    // The consumer reads each frame into one reused buffer, as a lane does.
    let consumer = std::thread::spawn(move || {
        let mut link = link(&peer, true);
        let mut buf = vec![0u8; *sizes_owned.iter().max().unwrap()];
        let mut check = 0u64;
        for _ in 0..total {
            let h = link.recv_header().unwrap();
            link.recv_exact(&mut buf[..h.len as usize]).unwrap();
            check = check.wrapping_add(u64::from(buf[h.len as usize - 1]));
        }
        check
    });
    let mut link = link(&region, false);
    let payload: Vec<u8> = (0..*sizes.iter().max().unwrap())
        .map(|i| (i * 7) as u8)
        .collect();
    for &n in sizes {
        let mut rates = Vec::new();
        for _ in 0..ROUNDS {
            let mut w = wormhole_wire::Writer::new(1);
            w.trailing_bytes(n - 8);
            let frame = w.finish(0, 0).unwrap();
            let t = Instant::now();
            link.send_parts(&[&frame, &payload[..n - 8]]).unwrap();
            // A frame far larger than the ring streams through it: when the last byte is in,
            // the consumer is at most one ring (256 KiB) behind, so the sends time the lane.
            rates.push(gbps(n, t.elapsed().as_secs_f64()));
        }
        println!(
            "lane {:>4} MiB frames: median {:>6.2} GB/s",
            n >> 20,
            median(rates)
        );
    }
    consumer.join().unwrap();
}

fn arena(sizes: &[usize]) {
    let a = Arena::create(1 << 30).unwrap();
    for &n in sizes {
        // The application's buffer sits 16 bytes past a page, as a malloc'ed one does.
        let mut app = vec![0x5Au8; n + 4096];
        let app = &mut app[16..16 + n];
        let shared = a.range(0, n as u64).unwrap();
        for (what, to_shared) in [("write", true), ("read", false)] {
            let mut rates = Vec::new();
            for _ in 0..ROUNDS {
                let t = Instant::now();
                // SAFETY: both ranges hold `n` bytes and are disjoint.
                unsafe {
                    if to_shared {
                        copy_bulk(shared, app.as_ptr(), n);
                    } else {
                        copy_bulk(app.as_mut_ptr(), shared, n);
                    }
                }
                rates.push(gbps(n, t.elapsed().as_secs_f64()));
            }
            println!(
                "arena {what:>5} {:>4} MiB: median {:>6.2} GB/s",
                n >> 20,
                median(rates)
            );
        }
    }
}

/// The copy kernel alone, in the caches: one ring piece (32 KiB) at a time between shared
/// memory and an application buffer 16 bytes past a page, and one frame header (16 bytes).
fn pieces() {
    let a = Arena::create(1 << 20).unwrap();
    let shared = a.range(0, 1 << 16).unwrap();
    let mut app = vec![0u8; (1 << 16) + 4096];
    let app = &mut app[16..];
    for (n, reps) in [(16usize, 10_000_000usize), (32 << 10, 100_000)] {
        for (what, to_shared) in [("write", true), ("read", false)] {
            let mut rates = Vec::new();
            for _ in 0..ROUNDS {
                let t = Instant::now();
                for _ in 0..reps {
                    // SAFETY: both ranges hold `n` bytes and are disjoint.
                    unsafe {
                        if to_shared {
                            copy_bulk(shared, app.as_ptr(), n);
                        } else {
                            copy_bulk(app.as_mut_ptr(), shared, n);
                        }
                    }
                }
                rates.push(t.elapsed().as_secs_f64() / reps as f64);
            }
            let secs = median(rates);
            if n < 4096 {
                println!("piece {what:>5} {n:>5} B: median {:>6.2} ns", secs * 1e9);
            } else {
                println!(
                    "piece {what:>5} {:>3} KiB: median {:>6.2} GB/s",
                    n >> 10,
                    gbps(n, secs)
                );
            }
        }
    }
}

fn main() {
    let sizes = [16 << 20, 256 << 20];
    pieces();
    ring(&sizes);
    arena(&sizes);
}
