//! SEND/RECV client and server: a Rust port of the seed's (003) message exchange. The client
//! SENDs messages, the server RECVs each one, prints it and SENDs a reply back.
//!
//! ```text
//! cargo run --example send_recv                          # both roles in one process (loopback)
//! cargo run --example send_recv -- --server [-p 18520]   # server
//! cargo run --example send_recv -- 127.0.0.1 [-p 18520]  # client
//! ```
//!
//! The two sides exchange their QPN, PSN, GID (and MR address and rkey) out of band over a TCP
//! connection, the way `rc_pingpong` does, then move their RC QPs RESET→INIT→RTR→RTS by hand —
//! the verbs-only way; `rdma_cm_server`/`rdma_cm_client` (seed 001) and `epoll_loop` (seed 002)
//! connect with rdma_cm instead. With no arguments the example runs the server on a thread and
//! the client on the main thread, each with its own device context, over loopback TCP.
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
#[command(about = "SEND/RECV client/server over softrdma (no args: loopback, both roles)")]
struct Opts {
    /// Run as the server.
    #[arg(long)]
    server: bool,
    /// Server host to connect to (client mode).
    host: Option<String>,
    /// TCP port of the out-of-band exchange.
    #[arg(short, long, default_value_t = 18520)]
    port: u16,
    /// softrdma device name (default: the first, i.e. loopback).
    #[arg(short, long)]
    dev: Option<String>,
    /// Number of messages the client sends.
    #[arg(short = 'n', long, default_value_t = 5)]
    iters: u32,
    /// Seconds any single wait may take.
    #[arg(short, long, default_value_t = 20)]
    timeout: u64,
}

// ---------------------------------------------------------------------------------------------
// Shared helpers (the same in send_recv.rs, rdma_rw.rs and epoll_loop.rs; not every example
// uses every item).

// ---------------------------------------------------------------------------------------------

/// Message slots: receive buffers at `slot * MSG`, send buffers at `(SLOTS + slot) * MSG`.
const SLOTS: usize = 16;
const MSG: usize = 256;
const SEND_BIT: u64 = 1 << 32;

fn new_endpoint(name: &'static str, o: &Opts) -> Res<Endpoint> {
    Endpoint::new(
        name,
        o.dev.as_deref(),
        2 * SLOTS * MSG,
        AccessFlags::LOCAL_WRITE,
        false,
        Duration::from_secs(o.timeout),
    )
}

fn server(listener: TcpListener, o: &Opts) -> Res<()> {
    let ep = new_endpoint("server", o)?;
    // Receives go up before the client can send anything.
    for slot in 0..SLOTS {
        ep.post_recv(slot as u64, slot * MSG, MSG)?;
    }
    let stream = accept(&listener, Duration::from_secs(o.timeout))?;
    drop(listener);
    let mut oob = Oob::new(stream, Duration::from_secs(o.timeout))?;
    let peer = PeerInfo::decode(&oob.recv()?)?;
    ep.connect(&peer)?;
    oob.send(&ep.info(0).encode())?;
    println!(
        "server: connected to QPN {:#08x}, expecting {} messages",
        peer.qpn, peer.n
    );

    let n = peer.n as usize;
    let (mut received, mut replied) = (0usize, 0usize);
    while received < n || replied < n {
        let wc = ep.next_wc()?;
        match wc.opcode {
            WcOpcode::Recv => {
                let slot = (wc.wr_id as usize) % SLOTS;
                let msg = ep.read_str(slot * MSG, wc.byte_len as usize)?;
                println!("server received: {msg}");
                ep.post_recv(slot as u64, slot * MSG, MSG)?;
                let reply = format!("reply to {msg}");
                let soff = (SLOTS + received % SLOTS) * MSG;
                ep.mr
                    .write(soff, reply.as_bytes())
                    .map_err(|e| e.to_string())?;
                ep.post_send(SEND_BIT | received as u64, SendOp::Send, soff, reply.len())?;
                received += 1;
            }
            WcOpcode::Send => replied += 1,
            other => return Err(format!("server: unexpected completion {other:?}")),
        }
    }
    // Tell the client we are done only after every reply was acknowledged.
    oob.send("bye\n")?;
    println!("server: received and answered {n} messages");
    Ok(())
}

fn client(stream: TcpStream, o: &Opts) -> Res<()> {
    let ep = new_endpoint("client", o)?;
    for slot in 0..SLOTS {
        ep.post_recv(slot as u64, slot * MSG, MSG)?;
    }
    let mut oob = Oob::new(stream, Duration::from_secs(o.timeout))?;
    oob.send(&ep.info(o.iters).encode())?;
    let peer = PeerInfo::decode(&oob.recv()?)?;
    ep.connect(&peer)?;
    println!("client: connected to QPN {:#08x}", peer.qpn);

    for i in 0..o.iters as usize {
        let msg = format!("message {i} from client");
        let soff = (SLOTS + i % SLOTS) * MSG;
        ep.mr
            .write(soff, msg.as_bytes())
            .map_err(|e| e.to_string())?;
        ep.post_send(SEND_BIT | i as u64, SendOp::Send, soff, msg.len())?;
        let (mut sent, mut reply) = (false, None);
        while !sent || reply.is_none() {
            let wc = ep.next_wc()?;
            match wc.opcode {
                WcOpcode::Send => sent = true,
                WcOpcode::Recv => {
                    let slot = (wc.wr_id as usize) % SLOTS;
                    reply = Some(ep.read_str(slot * MSG, wc.byte_len as usize)?);
                    ep.post_recv(slot as u64, slot * MSG, MSG)?;
                }
                other => return Err(format!("client: unexpected completion {other:?}")),
            }
        }
        let reply = reply.unwrap();
        println!("client received: {reply}");
        if reply != format!("reply to {msg}") {
            return Err(format!("client: wrong reply {reply:?} to {msg:?}"));
        }
    }
    let bye = oob.recv()?;
    if bye.trim() != "bye" {
        return Err(format!("client: expected bye from the server, got {bye:?}"));
    }
    Ok(())
}

fn run(o: Opts) -> Res<()> {
    if o.iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    let roles = Roles {
        name: "send_recv",
        host: o.host.as_deref(),
        server: o.server,
        port: o.port,
        timeout: Duration::from_secs(o.timeout),
    };
    run_roles(roles, &o, server, client)
}

fn main() -> ExitCode {
    finish("send_recv", run(Opts::parse()))
}
