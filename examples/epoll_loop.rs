//! An epoll event loop over a completion channel: a Rust port of the seed's (002) flow. Each side
//! creates a completion channel, makes its fd non-blocking and puts it in an epoll set together
//! with the TCP socket it used for the exchange, then arms its CQ with `req_notify`. On readiness
//! of the channel fd it calls `get_cq_event`, `ack_events`, `req_notify` again and drains the CQ
//! with `poll`; readiness of the socket carries the end-of-run handshake. The client SENDs N
//! messages one after another; the server answers each with a reply.
//!
//! ```text
//! cargo run --example epoll_loop                          # both roles in one process (loopback)
//! cargo run --example epoll_loop -- --server [-p 18522]   # server
//! cargo run --example epoll_loop -- 127.0.0.1 [-p 18522]  # client
//! ```
//!
//! The seed also watches the rdma_cm event channel fd; softrdma has no connection manager yet, so
//! the two sides exchange QPN, PSN and GID out of band over TCP instead (the way `rc_pingpong`
//! does) and that TCP socket takes the CM channel's place in the epoll set. With no arguments the
//! example runs the server on a thread and the client on the main thread, each with its own
//! device context, over loopback TCP.
//!
//! Every wait is bounded; the process exits 0 on success and 1 with a message on failure.

use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Parser;
use softrdma::verbs::{
    AccessFlags, CompletionChannel, SendOp, VerbsError, WcOpcode, WorkCompletion,
};

mod common;
use common::*;

#[derive(Parser, Debug, Clone)]
#[command(
    about = "epoll loop on a completion channel over softrdma (no args: loopback, both roles)"
)]
struct Opts {
    /// Run as the server.
    #[arg(long)]
    server: bool,
    /// Server host to connect to (client mode).
    host: Option<String>,
    /// TCP port of the out-of-band exchange.
    #[arg(short, long, default_value_t = 18522)]
    port: u16,
    /// softrdma device name (default: the first, i.e. loopback).
    #[arg(short, long)]
    dev: Option<String>,
    /// Number of messages the client sends.
    #[arg(short = 'n', long, default_value_t = 10)]
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

const TOKEN_CQ: u64 = 1;
const TOKEN_TCP: u64 = 2;

/// What one `epoll_wait` turned up.
#[derive(Default)]
struct Ready {
    /// Completions drained from the CQ (all successful).
    wcs: Vec<WorkCompletion>,
    /// The TCP socket is readable.
    tcp: bool,
}

/// The seed-002 loop: an epoll set holding the completion channel fd and the TCP socket.
struct EventLoop<'a> {
    ep: &'a Endpoint,
    channel: &'a CompletionChannel,
    epfd: OwnedFd,
    tcp_fd: RawFd,
    cq_events: u32,
}

impl<'a> EventLoop<'a> {
    fn new(ep: &'a Endpoint, tcp: &TcpStream) -> Res<EventLoop<'a>> {
        let name = ep.name;
        let channel = ep.channel.as_ref().ok_or("no completion channel")?;
        channel
            .set_nonblocking(true)
            .map_err(|e| format!("{name}: set_nonblocking: {e}"))?;
        // SAFETY: epoll_create1 has no memory-safety preconditions; the result is checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(format!(
                "{name}: epoll_create1: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let epfd = unsafe { OwnedFd::from_raw_fd(fd) };
        let l = EventLoop {
            ep,
            channel,
            epfd,
            tcp_fd: tcp.as_raw_fd(),
            cq_events: 0,
        };
        l.ctl(libc::EPOLL_CTL_ADD, channel.fd(), TOKEN_CQ)?;
        l.ctl(libc::EPOLL_CTL_ADD, l.tcp_fd, TOKEN_TCP)?;
        ep.cq
            .req_notify(false)
            .map_err(|e| format!("{name}: req_notify: {e}"))?;
        Ok(l)
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, token: u64) -> Res<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        // SAFETY: a valid epoll fd, an open fd and a live epoll_event.
        if unsafe { libc::epoll_ctl(self.epfd.as_raw_fd(), op, fd, &mut ev) } < 0 {
            return Err(format!(
                "{}: epoll_ctl: {}",
                self.ep.name,
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }

    /// Stop watching the TCP socket (after its last expected line).
    fn forget_tcp(&self) -> Res<()> {
        self.ctl(libc::EPOLL_CTL_DEL, self.tcp_fd, 0)
    }

    /// Wait (bounded) until something is ready and handle the CQ side of it.
    fn wait(&mut self) -> Res<Ready> {
        let name = self.ep.name;
        let deadline = Instant::now() + self.ep.timeout;
        let mut events = [libc::epoll_event { events: 0, u64: 0 }; 4];
        loop {
            // SAFETY: `events` is a live array of 4 epoll_events.
            let n = unsafe { libc::epoll_wait(self.epfd.as_raw_fd(), events.as_mut_ptr(), 4, 200) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(format!("{name}: epoll_wait: {e}"));
            }
            let mut ready = Ready::default();
            for ev in &events[..n as usize] {
                let token = ev.u64;
                match token {
                    TOKEN_CQ => self.on_cq_ready(&mut ready)?,
                    TOKEN_TCP => ready.tcp = true,
                    _ => return Err(format!("{name}: unknown epoll token {token}")),
                }
            }
            if !ready.wcs.is_empty() || ready.tcp {
                return Ok(ready);
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "{name}: nothing happened within {:?}",
                    self.ep.timeout
                ));
            }
        }
    }

    fn on_cq_ready(&mut self, ready: &mut Ready) -> Res<()> {
        let name = self.ep.name;
        match self.channel.get_cq_event() {
            Ok(cq) => {
                cq.ack_events(1);
                self.cq_events += 1;
                // Re-arm before draining, so a completion that lands meanwhile raises an event.
                cq.req_notify(false)
                    .map_err(|e| format!("{name}: req_notify: {e}"))?;
            }
            Err(VerbsError::WouldBlock) => return Ok(()),
            Err(e) => return Err(format!("{name}: get_cq_event: {e}")),
        }
        let mut buf = [WorkCompletion::default(); 16];
        loop {
            let k = self
                .ep
                .cq
                .poll(&mut buf)
                .map_err(|e| format!("{name}: poll_cq: {e}"))?;
            if k == 0 {
                return Ok(());
            }
            for wc in &buf[..k] {
                ready.wcs.push(check(name, *wc)?);
            }
        }
    }
}

fn new_endpoint(name: &'static str, o: &Opts) -> Res<Endpoint> {
    let ep = Endpoint::new(
        name,
        o.dev.as_deref(),
        2 * SLOTS * MSG,
        AccessFlags::LOCAL_WRITE,
        true,
        Duration::from_secs(o.timeout),
    )?;
    for slot in 0..SLOTS {
        ep.post_recv(slot as u64, slot * MSG, MSG)?;
    }
    Ok(ep)
}

fn send_msg(ep: &Endpoint, i: usize, msg: &str) -> Res<()> {
    let soff = (SLOTS + i % SLOTS) * MSG;
    ep.mr
        .write(soff, msg.as_bytes())
        .map_err(|e| e.to_string())?;
    ep.post_send(SEND_BIT | i as u64, SendOp::Send, soff, msg.len())
}

/// Read a received message and give its buffer back to the receive queue.
fn take_msg(ep: &Endpoint, wc: &WorkCompletion) -> Res<String> {
    let slot = (wc.wr_id as usize) % SLOTS;
    let msg = ep.read_str(slot * MSG, wc.byte_len as usize)?;
    ep.post_recv(slot as u64, slot * MSG, MSG)?;
    Ok(msg)
}

fn server(listener: TcpListener, o: &Opts) -> Res<()> {
    let ep = new_endpoint("server", o)?;
    let timeout = Duration::from_secs(o.timeout);
    let stream = accept(&listener, timeout)?;
    drop(listener);
    let mut oob = Oob::new(stream, timeout)?;
    let peer = PeerInfo::decode(&oob.recv()?)?;
    ep.connect(&peer)?;
    let mut lp = EventLoop::new(&ep, &oob.w)?;
    oob.send(&ep.info(0).encode())?;
    println!(
        "server: connected to QPN {:#08x}, expecting {} messages",
        peer.qpn, peer.n
    );

    let n = peer.n as usize;
    let (mut received, mut replied, mut done) = (0usize, 0usize, false);
    while received < n || replied < n || !done {
        let ready = lp.wait()?;
        for wc in &ready.wcs {
            match wc.opcode {
                WcOpcode::Recv => {
                    let msg = take_msg(&ep, wc)?;
                    println!("server received: {msg}");
                    send_msg(&ep, received, &format!("reply to {msg}"))?;
                    received += 1;
                }
                WcOpcode::Send => replied += 1,
                other => return Err(format!("server: unexpected completion {other:?}")),
            }
        }
        if ready.tcp {
            let line = oob.recv()?;
            if line.trim() != "done" {
                return Err(format!("server: unexpected line from the client {line:?}"));
            }
            done = true;
            lp.forget_tcp()?;
        }
    }
    oob.send("bye\n")?;
    println!(
        "server: received and answered {n} messages, {} CQ events",
        lp.cq_events
    );
    Ok(())
}

fn client(stream: TcpStream, o: &Opts) -> Res<()> {
    let ep = new_endpoint("client", o)?;
    let mut oob = Oob::new(stream, Duration::from_secs(o.timeout))?;
    oob.send(&ep.info(o.iters).encode())?;
    let peer = PeerInfo::decode(&oob.recv()?)?;
    ep.connect(&peer)?;
    let mut lp = EventLoop::new(&ep, &oob.w)?;
    println!("client: connected to QPN {:#08x}", peer.qpn);

    let n = o.iters as usize;
    let msg = |i: usize| format!("message {i} from client");
    send_msg(&ep, 0, &msg(0))?;
    let (mut replies, mut sent, mut said_done) = (0usize, 0usize, false);
    loop {
        let ready = lp.wait()?;
        for wc in &ready.wcs {
            match wc.opcode {
                WcOpcode::Recv => {
                    let reply = take_msg(&ep, wc)?;
                    println!("client received: {reply}");
                    if reply != format!("reply to {}", msg(replies)) {
                        return Err(format!("client: wrong reply {reply:?}"));
                    }
                    replies += 1;
                    if replies < n {
                        send_msg(&ep, replies, &msg(replies))?;
                    }
                }
                WcOpcode::Send => sent += 1,
                other => return Err(format!("client: unexpected completion {other:?}")),
            }
        }
        if ready.tcp {
            let line = oob.recv()?;
            if said_done && line.trim() == "bye" {
                break;
            }
            return Err(format!("client: unexpected line from the server {line:?}"));
        }
        if replies == n && sent == n && !said_done {
            oob.send("done\n")?;
            said_done = true;
        }
    }
    println!("client: {n} replies received, {} CQ events", lp.cq_events);
    Ok(())
}

fn run(o: Opts) -> Res<()> {
    if o.iters == 0 {
        return Err("--iters must be at least 1".into());
    }
    let roles = Roles {
        name: "epoll_loop",
        host: o.host.as_deref(),
        server: o.server,
        port: o.port,
        timeout: Duration::from_secs(o.timeout),
    };
    run_roles(roles, &o, server, client)
}

fn main() -> ExitCode {
    finish("epoll_loop", run(Opts::parse()))
}
