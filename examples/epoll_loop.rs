//! An epoll event loop over the rdma_cm event channel and a completion channel: a Rust port of
//! the seed's (002) flow. Each side puts the CM channel's fd and the completion channel's fd in
//! one epoll set (edge-triggered, so each readiness is drained until it would block), arms its CQ
//! with `req_notify`, and handles whatever turns up: CM events (connect request, established,
//! disconnected) and completions (`get_cq_event`, `ack_events`, `req_notify` again, `poll`).
//! The client SENDs N messages one after another; the server answers each with a reply; the
//! client then disconnects and both see DISCONNECTED.
//!
//! ```text
//! cargo run --example epoll_loop                          # both roles in one process (loopback)
//! cargo run --example epoll_loop -- --server [-p 18522]   # server
//! cargo run --example epoll_loop -- 127.0.0.1 [-p 18522]  # client
//! ```
//!
//! Every wait is bounded; the process exits 0 on success and 1 with a message on failure.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, ToSocketAddrs};
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use softrdma::rdma_cm::{CmEvent, CmId, ConnParam, EventChannel, EventType, PortSpace};
use softrdma::verbs::{
    AccessFlags, CompletionChannel, CompletionQueue, MemoryRegion, ProtectionDomain, QpCaps,
    QpInitAttr, QpType, QueuePair, RecvWr, SendFlags, SendOp, SendWr, Sge, WcOpcode, WcStatus,
    WorkCompletion,
};

type Res<T> = Result<T, String>;

#[derive(Parser, Debug, Clone)]
#[command(
    about = "epoll loop on the rdma_cm and completion channels (no args: loopback, both roles)"
)]
struct Opts {
    /// Run as the server.
    #[arg(long)]
    server: bool,
    /// Server host to connect to (client mode).
    host: Option<String>,
    /// rdma_cm port (TCP port space).
    #[arg(short, long, default_value_t = 18522)]
    port: u16,
    /// Number of messages the client sends.
    #[arg(short = 'n', long, default_value_t = 10)]
    iters: u32,
    /// Seconds any single wait may take.
    #[arg(short, long, default_value_t = 20)]
    timeout: u64,
}

/// Message slots: receive buffers at `slot * MSG`, send buffers at `(SLOTS + slot) * MSG`.
const SLOTS: usize = 16;
const MSG: usize = 256;
const SEND_BIT: u64 = 1 << 32;

const TOKEN_CM: u64 = 1;
const TOKEN_CQ: u64 = 2;

/// A connection's verbs resources (on the id's device).
struct Conn {
    id: CmId,
    _pd: ProtectionDomain,
    channel: CompletionChannel,
    cq: CompletionQueue,
    qp: QueuePair,
    mr: MemoryRegion,
}

impl Conn {
    /// PD, completion channel (non-blocking), CQ, QP on `id`, and every receive slot posted.
    fn new(id: &CmId) -> Res<Conn> {
        let ctx = id.context().ok_or("the id has no device")?;
        let pd = ctx.alloc_pd().map_err(|e| format!("alloc_pd: {e}"))?;
        let channel = ctx
            .create_comp_channel()
            .map_err(|e| format!("create_comp_channel: {e}"))?;
        channel
            .set_nonblocking(true)
            .map_err(|e| format!("set_nonblocking: {e}"))?;
        let cq = ctx
            .create_cq(2 * SLOTS as u32, Some(&channel))
            .map_err(|e| format!("create_cq: {e}"))?;
        let qp = id
            .create_qp(
                &pd,
                &QpInitAttr {
                    send_cq: &cq,
                    recv_cq: &cq,
                    cap: QpCaps {
                        max_send_wr: SLOTS as u32,
                        max_recv_wr: SLOTS as u32,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                    qp_type: QpType::Rc,
                    sq_sig_all: false,
                    srq: None,
                },
            )
            .map_err(|e| format!("rdma_create_qp: {e}"))?;
        let mr = pd
            .alloc_mr(2 * SLOTS * MSG, AccessFlags::LOCAL_WRITE)
            .map_err(|e| format!("reg_mr: {e}"))?;
        let c = Conn {
            id: id.clone(),
            _pd: pd,
            channel,
            cq,
            qp,
            mr,
        };
        for slot in 0..SLOTS {
            c.post_recv(slot as u64)?;
        }
        Ok(c)
    }

    fn post_recv(&self, slot: u64) -> Res<()> {
        self.qp
            .post_recv(&[RecvWr {
                wr_id: slot,
                sg_list: &[Sge {
                    addr: self.mr.addr() + slot * MSG as u64,
                    length: MSG as u32,
                    lkey: self.mr.lkey(),
                }],
            }])
            .map_err(|e| format!("post_recv: {e}"))
    }

    fn send(&self, slot: usize, text: &str) -> Res<()> {
        let off = (SLOTS + slot) * MSG;
        let b = text.as_bytes();
        self.mr.write(off, b).map_err(|e| e.to_string())?;
        self.qp
            .post_send(&[SendWr {
                wr_id: SEND_BIT | slot as u64,
                op: SendOp::Send,
                sg_list: &[Sge {
                    addr: self.mr.addr() + off as u64,
                    length: b.len() as u32,
                    lkey: self.mr.lkey(),
                }],
                flags: SendFlags::SIGNALED,
            }])
            .map_err(|e| format!("post_send: {e}"))
    }

    /// The text of a receive completion; its slot is posted again.
    fn take_recv(&self, wc: &WorkCompletion) -> Res<String> {
        let mut b = vec![0u8; wc.byte_len as usize];
        self.mr
            .read(wc.wr_id as usize * MSG, &mut b)
            .map_err(|e| e.to_string())?;
        self.post_recv(wc.wr_id)?;
        Ok(String::from_utf8_lossy(&b).into_owned())
    }
}

/// What one `epoll_wait` turned up.
#[derive(Default)]
struct Ready {
    cm: Vec<CmEvent>,
    wcs: Vec<WorkCompletion>,
}

/// The seed-002 loop: one epoll set with the CM channel fd and (once there is a connection) the
/// completion channel fd.
struct EventLoop {
    epfd: OwnedFd,
    cq_events: u32,
    timeout: Duration,
}

impl EventLoop {
    fn new(ch: &EventChannel, timeout: Duration) -> Res<EventLoop> {
        ch.set_nonblocking(true).map_err(|e| e.to_string())?;
        // SAFETY: epoll_create1 has no memory-safety preconditions; the result is checked.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(format!(
                "epoll_create1: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let epfd = unsafe { OwnedFd::from_raw_fd(fd) };
        let l = EventLoop {
            epfd,
            cq_events: 0,
            timeout,
        };
        l.add(ch.fd(), TOKEN_CM)?;
        Ok(l)
    }

    fn add(&self, fd: RawFd, token: u64) -> Res<()> {
        use std::os::fd::AsRawFd;
        let mut ev = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLET) as u32,
            u64: token,
        };
        // SAFETY: `ev` is a live epoll_event; both fds are open.
        let r = unsafe { libc::epoll_ctl(self.epfd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) };
        if r != 0 {
            return Err(format!("epoll_ctl: {}", std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Watch a connection's completion channel too, with its CQ armed.
    fn watch(&self, c: &Conn) -> Res<()> {
        self.add(c.channel.fd(), TOKEN_CQ)?;
        c.cq.req_notify(false)
            .map_err(|e| format!("req_notify: {e}"))
    }

    /// One `epoll_wait` (bounded), then drain every ready source (edge-triggered).
    fn wait(&mut self, ch: &EventChannel, conn: Option<&Conn>) -> Res<Ready> {
        use std::os::fd::AsRawFd;
        let mut evs = [libc::epoll_event { events: 0, u64: 0 }; 4];
        // SAFETY: `evs` is a live array of 4 epoll_event structures.
        let n = unsafe {
            libc::epoll_wait(
                self.epfd.as_raw_fd(),
                evs.as_mut_ptr(),
                evs.len() as i32,
                self.timeout.as_millis() as i32,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(Ready::default());
            }
            return Err(format!("epoll_wait: {e}"));
        }
        if n == 0 {
            return Err(format!("nothing happened for {:?}", self.timeout));
        }
        let mut r = Ready::default();
        for ev in &evs[..n as usize] {
            match ev.u64 {
                TOKEN_CM => {
                    // rdma_get_cm_event until EAGAIN.
                    while let Ok(e) = ch.get_cm_event() {
                        r.cm.push(e);
                    }
                }
                TOKEN_CQ => {
                    let Some(c) = conn else { continue };
                    while let Ok(cq) = c.channel.get_cq_event() {
                        cq.ack_events(1);
                        self.cq_events += 1;
                        cq.req_notify(false)
                            .map_err(|e| format!("req_notify: {e}"))?;
                    }
                    drain(&c.cq, &mut r.wcs)?;
                }
                _ => {}
            }
        }
        // Completions that raced with re-arming are picked up now, not at the next event.
        if let Some(c) = conn {
            drain(&c.cq, &mut r.wcs)?;
        }
        Ok(r)
    }
}

fn drain(cq: &CompletionQueue, out: &mut Vec<WorkCompletion>) -> Res<()> {
    let mut wc = [WorkCompletion::default(); 8];
    loop {
        let n = cq.poll(&mut wc).map_err(|e| format!("poll: {e}"))?;
        for w in &wc[..n] {
            match w.status {
                WcStatus::Success => out.push(*w),
                // The receives still posted when the connection goes down.
                WcStatus::WrFlushErr => {}
                s => return Err(format!("completion {:#x}: {}", w.wr_id, s.as_str())),
            }
        }
        if n < wc.len() {
            return Ok(());
        }
    }
}

fn server(ch: EventChannel, listen: CmId, o: &Opts) -> Res<()> {
    let mut lp = EventLoop::new(&ch, Duration::from_secs(o.timeout))?;
    let mut conn: Option<Conn> = None;
    let mut answered = 0u32;
    loop {
        let r = lp.wait(&ch, conn.as_ref())?;
        for ev in r.cm {
            match ev.event() {
                EventType::ConnectRequest if conn.is_none() => {
                    let c = Conn::new(ev.id())?;
                    lp.watch(&c)?;
                    ev.id()
                        .accept(&ConnParam::default())
                        .map_err(|e| format!("accept: {e}"))?;
                    conn = Some(c);
                }
                EventType::ConnectRequest => {
                    let _ = ev.id().reject(b"busy");
                }
                EventType::Established => println!("server: connection established"),
                EventType::Disconnected => {
                    let c = conn.take().ok_or("DISCONNECTED without a connection")?;
                    let _ = c.id.disconnect();
                    println!(
                        "server: client disconnected; received and answered {answered} messages, {} CQ events",
                        lp.cq_events
                    );
                    drop(ev);
                    listen.destroy();
                    return Ok(());
                }
                e => return Err(format!("server: unexpected {e} (status {})", ev.status())),
            }
        }
        let Some(c) = conn.as_ref() else { continue };
        for wc in r.wcs {
            if wc.opcode == WcOpcode::Recv {
                let msg = c.take_recv(&wc)?;
                println!("server received: {msg}");
                c.send(answered as usize % SLOTS, &format!("reply to {msg}"))?;
                answered += 1;
            }
        }
    }
}

fn client(ch: EventChannel, dst: SocketAddr, o: &Opts) -> Res<()> {
    let mut lp = EventLoop::new(&ch, Duration::from_secs(o.timeout))?;
    let id = ch
        .create_id(PortSpace::Tcp)
        .map_err(|e| format!("rdma_create_id: {e}"))?;
    id.resolve_addr(None, dst, Duration::from_millis(2000))
        .map_err(|e| format!("resolve_addr: {e}"))?;
    let mut conn: Option<Conn> = None;
    let (mut sent, mut got) = (0u32, 0u32);
    let send_next = |c: &Conn, sent: &mut u32| -> Res<()> {
        c.send(
            *sent as usize % SLOTS,
            &format!("message {sent} from client"),
        )?;
        *sent += 1;
        Ok(())
    };
    loop {
        let r = lp.wait(&ch, conn.as_ref())?;
        for ev in r.cm {
            match ev.event() {
                EventType::AddrResolved => ev
                    .id()
                    .resolve_route(Duration::from_millis(2000))
                    .map_err(|e| format!("resolve_route: {e}"))?,
                EventType::RouteResolved => {
                    let c = Conn::new(ev.id())?;
                    lp.watch(&c)?;
                    ev.id()
                        .connect(&ConnParam::default())
                        .map_err(|e| format!("connect: {e}"))?;
                    conn = Some(c);
                }
                EventType::Established => {
                    let c = conn.as_ref().ok_or("ESTABLISHED without a QP")?;
                    println!(
                        "client: connected to QPN {:#08x}",
                        ev.conn_param().map_or(0, |p| p.qp_num)
                    );
                    send_next(c, &mut sent)?;
                }
                EventType::Disconnected => {
                    println!("client: {got} replies received, {} CQ events", lp.cq_events);
                    return if got == o.iters {
                        Ok(())
                    } else {
                        Err(format!("disconnected after {got} of {} replies", o.iters))
                    };
                }
                e => return Err(format!("client: {e} (status {})", ev.status())),
            }
        }
        let Some(c) = conn.as_ref() else { continue };
        for wc in r.wcs {
            if wc.opcode == WcOpcode::Recv {
                let reply = c.take_recv(&wc)?;
                println!("client received: {reply}");
                got += 1;
                if sent < o.iters {
                    send_next(c, &mut sent)?;
                } else if got == o.iters {
                    c.id.disconnect().map_err(|e| format!("disconnect: {e}"))?;
                }
            }
        }
    }
}

fn listen_on(ch: &EventChannel, ip: Ipv4Addr, port: u16) -> Res<CmId> {
    let l = ch
        .create_id(PortSpace::Tcp)
        .map_err(|e| format!("rdma_create_id: {e}"))?;
    l.bind_addr(SocketAddr::V4(SocketAddrV4::new(ip, port)))
        .map_err(|e| format!("bind port {port}: {e}"))?;
    l.listen(4).map_err(|e| format!("listen: {e}"))?;
    Ok(l)
}

fn run(o: &Opts) -> Res<()> {
    match (&o.host, o.server) {
        (Some(_), true) => Err("give either --server or a host, not both".into()),
        (None, true) => {
            let ch = EventChannel::new().map_err(|e| e.to_string())?;
            let l = listen_on(&ch, Ipv4Addr::UNSPECIFIED, o.port)?;
            server(ch, l, o)
        }
        (Some(h), false) => {
            let dst = (h.as_str(), o.port)
                .to_socket_addrs()
                .map_err(|e| format!("{h}: {e}"))?
                .find(|a| a.is_ipv4())
                .ok_or("no IPv4 address")?;
            client(EventChannel::new().map_err(|e| e.to_string())?, dst, o)
        }
        (None, false) => {
            println!("epoll_loop: loopback mode (server thread + client)");
            let ch = EventChannel::new().map_err(|e| e.to_string())?;
            // The first 127.0.0.x whose RoCE port no other process holds.
            let l = (1..=254u8)
                .find_map(|x| listen_on(&ch, Ipv4Addr::new(127, 0, 0, x), 0).ok())
                .ok_or("no free 127.0.0.x")?;
            let dst = SocketAddr::V4(l.local_addr().ok_or("unbound")?);
            let so = o.clone();
            let srv = std::thread::spawn(move || server(ch, l, &so));
            client(EventChannel::new().map_err(|e| e.to_string())?, dst, o)?;
            srv.join()
                .map_err(|_| "server thread panicked".to_string())?
        }
    }
}

fn main() -> ExitCode {
    let o = Opts::parse();
    match run(&o) {
        Ok(()) => {
            println!("epoll_loop: OK");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("epoll_loop: FAILED: {e}");
            ExitCode::FAILURE
        }
    }
}
