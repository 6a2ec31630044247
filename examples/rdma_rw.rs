//! RDMA WRITE and RDMA READ between a client and a server: a Rust port of the seed's (000) verbs
//! flow. The server registers a buffer with LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ and
//! advertises its address and rkey; the client RDMA WRITEs a pattern into it, RDMA READs it back
//! and compares, then tells the server, which checks that its own buffer holds the pattern — data
//! that arrived without the server's CPU posting a single work request.
//!
//! ```text
//! cargo run --example rdma_rw                          # both roles in one process (loopback)
//! cargo run --example rdma_rw -- --server [-p 18521]   # server
//! cargo run --example rdma_rw -- 127.0.0.1 [-p 18521]  # client
//! ```
//!
//! As the seed, the two sides exchange QPN, PSN, GID and the buffer's address and rkey out of band over a TCP connection, the way `rc_pingpong` does,
//! then move their RC QPs RESET→INIT→RTR→RTS by hand. The TCP connection also carries the final
//! "done"/"ok" handshake. With no arguments the example runs the server on a thread and the client
//! on the main thread, each with its own device context, over loopback TCP.
//!
//! Every wait is bounded; the process exits 0 on success and 1 with a message on failure.

use std::net::{TcpListener, TcpStream};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use softrdma::verbs::{AccessFlags, SendOp, WcOpcode};

mod common;
use common::*;

#[derive(Parser, Debug, Clone)]
#[command(about = "RDMA WRITE/READ client/server over softrdma (no args: loopback, both roles)")]
struct Opts {
    /// Run as the server.
    #[arg(long)]
    server: bool,
    /// Server host to connect to (client mode).
    host: Option<String>,
    /// TCP port of the out-of-band exchange.
    #[arg(short, long, default_value_t = 18521)]
    port: u16,
    /// softrdma device name (default: the first, i.e. loopback).
    #[arg(short, long)]
    dev: Option<String>,
    /// Bytes to write and read back (the server's buffer has this size too).
    #[arg(short, long, default_value_t = 4096)]
    size: usize,
    /// Seconds any single wait may take.
    #[arg(short, long, default_value_t = 20)]
    timeout: u64,
}

// ---------------------------------------------------------------------------------------------
// Shared helpers (the same in send_recv.rs, rdma_rw.rs and epoll_loop.rs; not every example
// uses every item).

// ---------------------------------------------------------------------------------------------

const WRITE_WRID: u64 = 1;
const READ_WRID: u64 = 2;

/// What the client writes: a readable prefix, then a byte pattern.
fn pattern(len: usize) -> Vec<u8> {
    let text = b"hello from the client, written by RDMA WRITE; ";
    (0..len)
        .map(|i| {
            if i < text.len() {
                text[i]
            } else {
                (i as u32).wrapping_mul(7).wrapping_add(3) as u8
            }
        })
        .collect()
}

fn preview(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(28)]).into_owned()
}

fn server(listener: TcpListener, o: &Opts) -> Res<()> {
    let access = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_WRITE | AccessFlags::REMOTE_READ;
    let timeout = Duration::from_secs(o.timeout);
    let ep = Endpoint::new("server", o.dev.as_deref(), o.size, access, false, timeout)?;
    let stream = accept(&listener, timeout)?;
    drop(listener);
    let mut oob = Oob::new(stream, timeout)?;
    let peer = PeerInfo::decode(&oob.recv()?)?;
    if peer.n as usize > o.size {
        oob.send("bad\n").ok();
        return Err(format!(
            "server: client wants to write {} bytes, the buffer holds {}",
            peer.n, o.size
        ));
    }
    ep.connect(&peer)?;
    let me = ep.info(o.size as u32);
    oob.send(&me.encode())?;
    println!(
        "server: buffer of {} bytes at {:#x}, rkey {:#010x} advertised",
        o.size, me.addr, me.rkey
    );

    // The server posts nothing: it only waits for the client to say it is finished.
    let done = oob.recv()?;
    if done.trim() != "done" {
        return Err(format!(
            "server: expected \"done\" from the client, got {done:?}"
        ));
    }
    let mut got = vec![0u8; peer.n as usize];
    ep.mr.read(0, &mut got).map_err(|e| e.to_string())?;
    if got != pattern(got.len()) {
        oob.send("bad\n").ok();
        return Err("server: buffer does not hold what the client wrote".into());
    }
    println!(
        "server: buffer verified, holds the {} bytes written by the client: {:?}...",
        got.len(),
        preview(&got)
    );
    oob.send("ok\n")
}

fn client(stream: TcpStream, o: &Opts) -> Res<()> {
    let timeout = Duration::from_secs(o.timeout);
    let size = o.size;
    let ep = Endpoint::new(
        "client",
        o.dev.as_deref(),
        2 * size,
        AccessFlags::LOCAL_WRITE,
        false,
        timeout,
    )?;
    let mut oob = Oob::new(stream, timeout)?;
    oob.send(&ep.info(size as u32).encode())?;
    let peer = PeerInfo::decode(&oob.recv()?)?;
    ep.connect(&peer)?;
    println!(
        "client: connected to QPN {:#08x}, remote buffer {:#x} rkey {:#010x}",
        peer.qpn, peer.addr, peer.rkey
    );

    // RDMA WRITE local [0, size) to the server's buffer.
    let data = pattern(size);
    ep.mr.write(0, &data).map_err(|e| e.to_string())?;
    ep.post_send(
        WRITE_WRID,
        SendOp::RdmaWrite {
            remote_addr: peer.addr,
            rkey: peer.rkey,
        },
        0,
        size,
    )?;
    let wc = ep.next_wc()?;
    if wc.wr_id != WRITE_WRID || wc.opcode != WcOpcode::RdmaWrite {
        return Err(format!("client: unexpected completion {wc:?}"));
    }
    println!("client: RDMA WRITE of {size} bytes completed");

    // RDMA READ it back into local [size, 2 * size).
    ep.post_send(
        READ_WRID,
        SendOp::RdmaRead {
            remote_addr: peer.addr,
            rkey: peer.rkey,
        },
        size,
        size,
    )?;
    let wc = ep.next_wc()?;
    if wc.wr_id != READ_WRID || wc.opcode != WcOpcode::RdmaRead {
        return Err(format!("client: unexpected completion {wc:?}"));
    }
    let mut back = vec![0u8; size];
    ep.mr.read(size, &mut back).map_err(|e| e.to_string())?;
    if back != data {
        return Err("client: RDMA READ returned different bytes than were written".into());
    }
    println!(
        "client: RDMA READ returned the {size} bytes written: {:?}...",
        preview(&back)
    );

    oob.send("done\n")?;
    let verdict = oob.recv()?;
    if verdict.trim() != "ok" {
        return Err(format!("client: server reports {:?}", verdict.trim()));
    }
    Ok(())
}

fn run(o: Opts) -> Res<()> {
    if o.size == 0 || o.size > u32::MAX as usize {
        return Err("--size must be between 1 and 2^32-1".into());
    }
    let roles = Roles {
        name: "rdma_rw",
        host: o.host.as_deref(),
        server: o.server,
        port: o.port,
        timeout: Duration::from_secs(o.timeout),
    };
    run_roles(roles, &o, server, client)
}

fn main() -> ExitCode {
    finish("rdma_rw", run(Opts::parse()))
}
