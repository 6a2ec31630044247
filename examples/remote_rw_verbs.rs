//! RDMA READ and WRITE into a peer's buffer over raw verbs: the server registers its own 1 MiB
//! `Vec<u8>` and exposes it; the client writes each 4 KiB chunk and reads it back. QP endpoints
//! and the buffer travel over a TCP connection, as ibv_rc_pingpong's do. One process, two
//! threads (`cargo run --example remote_rw_verbs`); no unsafe.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use softrdma::verbs::*;

const SIZE: usize = 1 << 20;
const CHUNK: usize = 4096;
const T: Duration = Duration::from_secs(10);
type Res<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Send ours, receive theirs (the same length).
fn swap(tcp: &mut TcpStream, ours: &[u8]) -> Res<Vec<u8>> {
    tcp.write_all(ours)?;
    let mut theirs = vec![0; ours.len()];
    tcp.read_exact(&mut theirs)?;
    Ok(theirs)
}

fn pattern(chunk: usize) -> Vec<u8> {
    (0..CHUNK).map(|i| (i * 31 + chunk * 7) as u8).collect()
}

/// A PD, a CQ and an RC QP on the first device.
fn rc_qp() -> Res<(ProtectionDomain, CompletionQueue, Qp<Rc>)> {
    let ctx = devices()?
        .into_iter()
        .next()
        .ok_or("no RDMA device")?
        .open()?;
    let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(16, None)?);
    let qp = pd.create_rc_qp(&cq)?;
    Ok((pd, cq, qp))
}

fn server(listener: TcpListener) -> Res<()> {
    let (pd, _cq, qp) = rc_qp()?;
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
    let mr = pd.register(vec![0u8; SIZE], access)?;
    let (mut tcp, _) = listener.accept()?;
    let mut ours = qp.endpoint().to_bytes().to_vec();
    ours.extend(mr.remote(..)?.to_bytes());
    let theirs = swap(&mut tcp, &ours)?;
    qp.connect(
        &QpEndpoint::from_bytes(&theirs)?,
        &ConnectOptions::default(),
    )?;
    tcp.read_exact(&mut [0u8])?; // the client is done
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

fn client(mut tcp: TcpStream) -> Res<()> {
    let (pd, cq, qp) = rc_qp()?;
    let local = pd.alloc_mr(2 * CHUNK, AccessFlags::LOCAL_WRITE)?;
    let mut ours = qp.endpoint().to_bytes().to_vec();
    ours.resize(QpEndpoint::WIRE_LEN + RemoteSlice::WIRE_LEN, 0);
    let theirs = swap(&mut tcp, &ours)?;
    qp.connect(
        &QpEndpoint::from_bytes(&theirs)?,
        &ConnectOptions::default(),
    )?;
    let peer = RemoteSlice::from_bytes(&theirs[QpEndpoint::WIRE_LEN..])?;
    for (c, chunk) in peer.chunks(CHUNK as u64).enumerate() {
        local.write(0, &pattern(c))?;
        qp.write(local.slice(..CHUNK)?, chunk).id(c as u64).post()?;
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
    tcp.write_all(&[1])?;
    Ok(())
}

fn main() -> Res<()> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let tcp = TcpStream::connect(listener.local_addr()?)?;
    let s = std::thread::spawn(move || server(listener));
    client(tcp)?;
    s.join().map_err(|_| "the server panicked")??;
    Ok(())
}
