//! RDMA READ and WRITE into a peer's buffer over rdma_cm: the server exposes a 1 MiB buffer in
//! its acceptance's private data; the client writes each 4 KiB chunk and reads it back, then
//! disconnects; the server checks its buffer. One process, two threads, on the loopback device
//! (`cargo run --example remote_rw`); no unsafe.
use std::net::SocketAddr;
use std::time::Duration;

use softrdma::rdma_cm::{Connection, ConnectionOptions, Listener};
use softrdma::verbs::{AccessFlags, RemoteSlice};

const SIZE: usize = 1 << 20;
const CHUNK: usize = 4096;
const T: Duration = Duration::from_secs(10);
type Res<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn pattern(chunk: usize) -> Vec<u8> {
    (0..CHUNK).map(|i| (i * 31 + chunk * 7) as u8).collect()
}

fn server(listener: Listener) -> Res<()> {
    // The buffer is registered on the connection's PD, so the request comes first; its
    // address goes back in the acceptance.
    let (conn, mr) = listener.accept_with(|pd| {
        let access =
            AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        let mr = pd.register(vec![0u8; SIZE], access)?;
        let data = mr.remote(..)?.to_bytes();
        Ok((mr, ConnectionOptions::default().with_private_data(&data)))
    })?;
    assert!(
        conn.wait_disconnect(Duration::from_secs(60)),
        "the client disconnects"
    );
    let buf = mr.into_inner().map_err(|(e, _)| e)?;
    for c in 0..SIZE / CHUNK {
        assert_eq!(buf[c * CHUNK..(c + 1) * CHUNK], pattern(c)[..], "chunk {c}");
    }
    println!(
        "server: all {} chunks of my buffer hold what the client wrote",
        SIZE / CHUNK
    );
    Ok(())
}

fn client(to: SocketAddr) -> Res<()> {
    let conn = Connection::connect(to, &ConnectionOptions::default())?;
    let peer = RemoteSlice::from_bytes(conn.peer_data())?;
    let local = conn.pd().alloc_mr(2 * CHUNK, AccessFlags::LOCAL_WRITE)?;
    let (qp, cq) = (conn.qp(), conn.cq());
    for (c, chunk) in peer.chunks(CHUNK as u64).enumerate() {
        local.write(0, &pattern(c))?;
        qp.write(local.slice(..CHUNK)?, chunk).post()?;
        cq.wait(T)?.ok()?;
        qp.read(local.slice(CHUNK..)?, chunk).post()?;
        cq.wait(T)?.ok()?;
        let mut back = vec![0u8; CHUNK];
        local.read(CHUNK, &mut back)?;
        assert_eq!(back, pattern(c), "chunk {c} read back");
    }
    println!(
        "client: wrote and read back {} chunks of {CHUNK} bytes",
        SIZE / CHUNK
    );
    Ok(()) // dropping the connection disconnects
}

fn main() -> Res<()> {
    let listener = Listener::bind("127.0.0.1:0".parse()?)?;
    let to = listener.local_addr().ok_or("no address")?;
    let s = std::thread::spawn(move || server(listener));
    client(to)?;
    s.join().map_err(|_| "the server panicked")??;
    Ok(())
}
