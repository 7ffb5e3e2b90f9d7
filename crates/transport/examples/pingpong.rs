//! Round trip of small frames over one lane between two threads (no OpenCL): the floor under
//! a forwarded call. `cargo run --release -p wormhole-transport --example pingpong`
use std::sync::Arc;
use std::time::Instant;
use wormhole_transport::{FrameLink, FutexWaiter, Layout, Region, ShmLink, SpinPolicy};

fn main() {
    let region = Arc::new(
        Region::create_memfd(Layout {
            lanes: 1,
            ring_capacity: 1 << 16,
        })
        .unwrap(),
    );
    let peer = Arc::new(Region::open_file(region.file().try_clone().unwrap()).unwrap());
    let n = 200_000;
    let server = std::thread::spawn(move || {
        let (req, rep) = peer.lane(0).unwrap();
        let mut link = ShmLink::new(
            rep,
            req,
            Arc::new(FutexWaiter),
            SpinPolicy::default(),
            Arc::new(|| true),
        );
        let mut body = Vec::new();
        for _ in 0..n {
            let h = link.recv(&mut body).unwrap();
            let w = wormhole_wire::Writer::new(h.opcode);
            link.send(&w.finish(wormhole_wire::FLAG_REPLY, h.seq).unwrap())
                .unwrap();
        }
    });
    let (req, rep) = region.lane(0).unwrap();
    let mut link = ShmLink::new(
        req,
        rep,
        Arc::new(FutexWaiter),
        SpinPolicy::default(),
        Arc::new(|| true),
    );
    let mut body = Vec::new();
    let mut lat = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        let mut w = wormhole_wire::Writer::new(1);
        w.u64(i as u64);
        link.send(&w.finish(0, i as u32).unwrap()).unwrap();
        link.recv(&mut body).unwrap();
        lat.push(t.elapsed().as_nanos() as u64);
    }
    server.join().unwrap();
    lat.sort();
    println!(
        "ring round trip: median {} ns, p99 {} ns",
        lat[n / 2],
        lat[n * 99 / 100]
    );
}
