//! `rping` over softrdma: rdma-core's rping (librdmacm/examples/rping.c) with the same flags,
//! output and wire protocol, so it pings a kernel `rping` in either role.
//!
//! ```text
//! rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]
//! rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]
//! ```
//! Each ping: the client advertises its source buffer by SEND (address, rkey, length: 16 bytes
//! big-endian), the server RDMA READs it, answers "go ahead" by SEND; the client advertises its
//! sink buffer, the server RDMA WRITEs the ping data back and says "go ahead" again. `-V` checks
//! the data that came back. One thread waits on the CM channel fd and the completion channel fd
//! together with poll(2), where rping uses a CM thread and a CQ thread.

#[allow(dead_code)]
mod getopt;

use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::process::ExitCode;
use std::time::Duration;

use softrdma::rdma_cm::{CmId, ConnParam, EventChannel, EventType, PortSpace};
use softrdma::verbs::{AccessFlags, QpCaps, SendFlags, SendOp, Sge, WcOpcode, WcStatus};
use softrdma::verbs::{
    CompletionChannel, CompletionQueue, MemoryRegion, ProtectionDomain, QpInitAttr, QpType,
    QueuePair, RecvWr, SendWr, WorkCompletion,
};

const BUFSIZE: usize = 64 * 1024;
/// `sizeof(stringify(INT_MAX)) + sizeof(RPING_MSG_FMT)`.
const MIN_BUFSIZE: usize = 11 + 15;
const SQ_DEPTH: u32 = 16;
/// `struct rping_rdma_info`: be64 buf, be32 rkey, be32 size.
const INFO_LEN: usize = 16;

struct Opts {
    server: Option<bool>,
    addr: Option<IpAddr>,
    src: Option<IpAddr>,
    port: u16,
    count: u64,
    size: usize,
    verbose: bool,
    validate: bool,
    debug: bool,
    persistent: bool,
}

fn usage() {
    println!("rping -s [-vVd] [-S size] [-C count] [-a addr] [-p port]");
    println!("rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port]");
    println!("\t-c\t\tclient side");
    println!("\t-I\t\tSource address to bind to for client.");
    println!("\t-s\t\tserver side.");
    println!("\t-v\t\tdisplay ping data to stdout");
    println!("\t-V\t\tvalidate ping data");
    println!("\t-d\t\tdebug printfs");
    println!("\t-S size \tping data size");
    println!("\t-C count\tping count times");
    println!("\t-a addr\t\taddress");
    println!("\t-p port\t\tport");
    println!("\t-P\t\tpersistent server mode allowing multiple connections");
}

fn get_addr(s: &str) -> Result<IpAddr, String> {
    if let Ok(a) = s.parse::<IpAddr>() {
        return Ok(a);
    }
    (s, 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut it| it.find(|a| a.is_ipv4()))
        .map(|a| a.ip())
        .ok_or_else(|| format!("getaddrinfo failed - invalid hostname or IP address ({s})"))
}

fn parse() -> Result<Opts, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let spec = getopt::Spec {
        with_value: "aIpCSt",
        flags: "PscvVdq",
        long: &[],
    };
    let mut o = Opts {
        server: None,
        addr: None,
        src: None,
        port: 7174,
        count: 0,
        size: 64,
        verbose: false,
        validate: false,
        debug: false,
        persistent: false,
    };
    for a in getopt::parse(&args, &spec)? {
        let getopt::Arg::Opt(c, v) = a else {
            return Err("unexpected argument".into());
        };
        let v = v.unwrap_or_default();
        match c {
            'a' => o.addr = Some(get_addr(&v)?),
            'I' => o.src = Some(get_addr(&v)?),
            'P' => o.persistent = true,
            'p' => o.port = v.trim().parse().map_err(|_| format!("bad port {v}"))?,
            's' => o.server = Some(true),
            'c' => o.server = Some(false),
            'S' => {
                let n: i64 = v.trim().parse().unwrap_or(0);
                if n < MIN_BUFSIZE as i64 || n > (BUFSIZE - 1) as i64 {
                    return Err(format!(
                        "Invalid size {n} (valid range is {MIN_BUFSIZE} to {BUFSIZE})"
                    ));
                }
                o.size = n as usize;
            }
            'C' => {
                let n: i64 = v.trim().parse().unwrap_or(-1);
                if n < 0 {
                    return Err(format!("Invalid count {n}"));
                }
                o.count = n as u64;
            }
            'v' => o.verbose = true,
            'V' => o.validate = true,
            'd' => o.debug = true,
            't' | 'q' => {} // type of service, self-created QP: accepted, not needed here
            _ => return Err(String::new()),
        }
    }
    if o.server.is_none() {
        return Err(String::new());
    }
    Ok(o)
}

macro_rules! debug {
    ($cb:expr, $($t:tt)*) => { if $cb.debug { println!($($t)*); } };
}

/// rping's `enum test_state`.
#[derive(Clone, Copy, PartialEq, Eq, Debug, PartialOrd, Ord)]
enum State {
    Idle = 1,
    Connected = 5,
    RdmaReadAdv,
    RdmaReadComplete,
    RdmaWriteAdv,
    RdmaWriteComplete,
    Disconnected,
    Error,
}

/// One connection: rping's control block.
struct Cb {
    server: bool,
    debug: bool,
    verbose: bool,
    validate: bool,
    size: usize,
    count: u64,
    ch: EventChannel,
    id: CmId,
    _pd: ProtectionDomain,
    cc: CompletionChannel,
    cq: CompletionQueue,
    qp: QueuePair,
    recv_mr: MemoryRegion,
    send_mr: MemoryRegion,
    rdma_mr: MemoryRegion,
    start_mr: Option<MemoryRegion>,
    remote: (u64, u32, u32),
    state: State,
    /// rping's semaphore: completions and CM events that woke the main loop.
    sem: u32,
}

fn signaled() -> SendFlags {
    SendFlags::SIGNALED
}

fn sge(mr: &MemoryRegion, len: usize) -> Sge {
    Sge {
        addr: mr.addr(),
        length: len as u32,
        lkey: mr.lkey(),
    }
}

impl Cb {
    /// `rping_setup_qp` + `rping_setup_buffers` + the first receive.
    fn new(o: &Opts, ch: EventChannel, id: CmId) -> Result<Cb, String> {
        let ctx = id.context().ok_or("the id has no device")?;
        let pd = ctx
            .alloc_pd()
            .map_err(|e| format!("ibv_alloc_pd failed: {e}"))?;
        let cc = ctx
            .create_comp_channel()
            .map_err(|e| format!("ibv_create_comp_channel failed: {e}"))?;
        let cq = ctx
            .create_cq(SQ_DEPTH * 2, Some(&cc))
            .map_err(|e| format!("ibv_create_cq failed: {e}"))?;
        cq.req_notify(false).map_err(|e| e.to_string())?;
        let qp = id
            .create_qp(
                &pd,
                &QpInitAttr {
                    send_cq: &cq,
                    recv_cq: &cq,
                    cap: QpCaps {
                        max_send_wr: SQ_DEPTH,
                        max_recv_wr: 2,
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
        let rw = AccessFlags::LOCAL_WRITE | AccessFlags::REMOTE_READ | AccessFlags::REMOTE_WRITE;
        let reg = |len: usize, a: AccessFlags| {
            pd.alloc_mr(len, a)
                .map_err(|e| format!("reg_mr failed: {e}"))
        };
        let recv_mr = reg(INFO_LEN, AccessFlags::LOCAL_WRITE)?;
        let send_mr = reg(INFO_LEN, AccessFlags::NONE)?;
        let rdma_mr = reg(o.size, rw)?;
        let start_mr = if o.server.unwrap_or(false) {
            None
        } else {
            Some(reg(o.size, rw)?)
        };
        let cb = Cb {
            server: o.server.unwrap_or(false),
            debug: o.debug,
            verbose: o.verbose,
            validate: o.validate,
            size: o.size,
            count: o.count,
            ch,
            id,
            _pd: pd,
            cc,
            cq,
            qp,
            recv_mr,
            send_mr,
            rdma_mr,
            start_mr,
            remote: (0, 0, 0),
            state: State::Idle,
            sem: 0,
        };
        cb.post_recv()?;
        debug!(cb, "allocated & registered buffers...");
        Ok(cb)
    }

    fn post_recv(&self) -> Result<(), String> {
        self.qp
            .post_recv(&[RecvWr {
                wr_id: 0,
                sg_list: &[sge(&self.recv_mr, INFO_LEN)],
            }])
            .map_err(|e| format!("ibv_post_recv failed: {e}"))
    }

    fn post(&self, op: SendOp, sg: Sge) -> Result<(), String> {
        self.qp
            .post_send(&[SendWr {
                wr_id: 0,
                op,
                sg_list: &[sg],
                flags: signaled(),
            }])
            .map_err(|e| format!("post send error {e}"))
    }

    /// SEND the 16-byte buffer advertisement (or the server's "go ahead").
    fn send_info(&self) -> Result<(), String> {
        self.post(SendOp::Send, sge(&self.send_mr, INFO_LEN))
    }

    /// `rping_format_send`.
    fn format_send(&self, mr: &MemoryRegion) -> Result<(), String> {
        let mut b = [0u8; INFO_LEN];
        b[..8].copy_from_slice(&mr.addr().to_be_bytes());
        b[8..12].copy_from_slice(&mr.rkey().to_be_bytes());
        b[12..].copy_from_slice(&(self.size as u32).to_be_bytes());
        debug!(
            self,
            "RDMA addr {:x} rkey {:x} len {}",
            mr.addr(),
            mr.rkey(),
            self.size
        );
        self.send_mr.write(0, &b).map_err(|e| e.to_string())
    }

    /// `sem_wait`: run the CM and CQ handlers until one of them posts, then report the state.
    fn sem_wait(&mut self) -> State {
        while self.sem == 0 {
            let mut fds = [
                libc::pollfd {
                    fd: self.ch.fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
                libc::pollfd {
                    fd: self.cc.fd(),
                    events: libc::POLLIN,
                    revents: 0,
                },
            ];
            // SAFETY: `fds` is a live array of two pollfd structures.
            unsafe { libc::poll(fds.as_mut_ptr(), 2, 1000) };
            if fds[0].revents & libc::POLLIN != 0 {
                self.cm_events();
            }
            if fds[1].revents & libc::POLLIN != 0 {
                self.cq_event();
            }
        }
        self.sem -= 1;
        self.state
    }

    fn post_sem(&mut self) {
        self.sem += 1;
    }

    /// `rping_cma_event_handler` for the events of an established connection.
    fn cm_events(&mut self) {
        self.ch.set_nonblocking(true).ok();
        while let Ok(ev) = self.ch.get_cm_event() {
            debug!(self, "cma_event type {}", ev.event());
            match ev.event() {
                EventType::Established => {
                    if !self.server {
                        self.state = State::Connected;
                    }
                    self.post_sem();
                }
                EventType::Disconnected => {
                    eprintln!(
                        "{} DISCONNECT EVENT...",
                        if self.server { "server" } else { "client" }
                    );
                    self.state = State::Disconnected;
                    self.post_sem();
                }
                EventType::ConnectRequest => {
                    // A second client while this one runs: refused (rping would block).
                    let _ = ev.id().reject(&[]);
                }
                EventType::TimewaitExit => {}
                e => {
                    eprintln!("cma event {}, error {}", e, ev.status());
                    self.state = State::Error;
                    self.post_sem();
                }
            }
        }
        self.ch.set_nonblocking(false).ok();
    }

    /// `cq_thread` + `rping_cq_event_handler`.
    fn cq_event(&mut self) {
        self.cc.set_nonblocking(true).ok();
        let got = self.cc.get_cq_event();
        self.cc.set_nonblocking(false).ok();
        let Ok(cq) = got else { return };
        cq.ack_events(1);
        if self.cq.req_notify(false).is_err() {
            eprintln!("Failed to set notify!");
        }
        let mut wc = [WorkCompletion::default()];
        while let Ok(1) = self.cq.poll(&mut wc) {
            let wc = wc[0];
            if wc.status != WcStatus::Success {
                if wc.status == WcStatus::WrFlushErr {
                    continue;
                }
                eprintln!("cq completion failed status {}", wc.status as i32);
                self.state = State::Error;
                self.post_sem();
                return;
            }
            match wc.opcode {
                WcOpcode::Send => debug!(self, "send completion"),
                WcOpcode::RdmaWrite => {
                    debug!(self, "rdma write completion");
                    self.state = State::RdmaWriteComplete;
                    self.post_sem();
                }
                WcOpcode::RdmaRead => {
                    debug!(self, "rdma read completion");
                    self.state = State::RdmaReadComplete;
                    self.post_sem();
                }
                WcOpcode::Recv => {
                    debug!(self, "recv completion");
                    if wc.byte_len as usize != INFO_LEN {
                        eprintln!("Received bogus data, size {}", wc.byte_len);
                        self.state = State::Error;
                        self.post_sem();
                        return;
                    }
                    if self.server {
                        let mut b = [0u8; INFO_LEN];
                        let _ = self.recv_mr.read(0, &mut b);
                        let addr = u64::from_be_bytes(b[..8].try_into().expect("8"));
                        let rkey = u32::from_be_bytes(b[8..12].try_into().expect("4"));
                        let len = u32::from_be_bytes(b[12..].try_into().expect("4"));
                        debug!(
                            self,
                            "Received rkey {rkey:x} addr {addr:x} len {len} from peer"
                        );
                        self.remote = (addr, rkey, len);
                        self.state = if self.state <= State::Connected
                            || self.state == State::RdmaWriteComplete
                        {
                            State::RdmaReadAdv
                        } else {
                            State::RdmaWriteAdv
                        };
                    } else {
                        self.state = if self.state == State::RdmaReadAdv {
                            State::RdmaWriteAdv
                        } else {
                            State::RdmaWriteComplete
                        };
                    }
                    if let Err(e) = self.post_recv() {
                        eprintln!("post recv error: {e}");
                        self.state = State::Error;
                    }
                    self.post_sem();
                }
                _ => {
                    debug!(self, "unknown!!!!! completion");
                    self.state = State::Error;
                    self.post_sem();
                    return;
                }
            }
        }
    }

    /// The NUL-terminated string at the start of the RDMA buffer.
    fn rdma_str(&self) -> String {
        let mut b = vec![0u8; self.size];
        let _ = self.rdma_mr.read(0, &mut b);
        let n = b.iter().position(|&c| c == 0).unwrap_or(b.len());
        String::from_utf8_lossy(&b[..n]).into_owned()
    }

    /// `rping_test_server`.
    fn test_server(&mut self) -> Result<(), String> {
        loop {
            let st = self.sem_wait();
            if st != State::RdmaReadAdv {
                return self.end(format!("wait for RDMA_READ_ADV state {}", st as i32));
            }
            debug!(self, "server received sink adv");
            let (addr, rkey, len) = self.remote;
            let sg = sge(&self.rdma_mr, len as usize);
            self.post(
                SendOp::RdmaRead {
                    remote_addr: addr,
                    rkey,
                },
                sg,
            )?;
            debug!(self, "server posted rdma read req ");
            let st = self.sem_wait();
            if st != State::RdmaReadComplete {
                return self.end(format!("wait for RDMA_READ_COMPLETE state {}", st as i32));
            }
            debug!(self, "server received read complete");
            if self.verbose {
                println!("server ping data: {}", self.rdma_str());
            }
            self.send_info()?;
            debug!(self, "server posted go ahead");
            let st = self.sem_wait();
            if st != State::RdmaWriteAdv {
                return self.end(format!("wait for RDMA_WRITE_ADV state {}", st as i32));
            }
            debug!(self, "server received sink adv");
            let (addr, rkey, _) = self.remote;
            let n = self.rdma_str().len() + 1;
            let sg = sge(&self.rdma_mr, n.min(self.size));
            self.post(
                SendOp::RdmaWrite {
                    remote_addr: addr,
                    rkey,
                },
                sg,
            )?;
            let st = self.sem_wait();
            if st != State::RdmaWriteComplete {
                return self.end(format!("wait for RDMA_WRITE_COMPLETE state {}", st as i32));
            }
            debug!(self, "server rdma write complete ");
            self.send_info()?;
            debug!(self, "server posted go ahead");
        }
    }

    /// A loop ends: fine if the peer disconnected, else the error.
    fn end(&self, msg: String) -> Result<(), String> {
        if self.state == State::Disconnected {
            Ok(())
        } else {
            Err(msg)
        }
    }

    /// The ping pattern: `rdma-ping-N: ` then letters A..z cycling from `start`, NUL at the end.
    fn fill_ping(&self, ping: u64, start: u8) -> Vec<u8> {
        let mut b = format!("rdma-ping-{}: ", ping as i32).into_bytes();
        b.truncate(self.size - 1);
        let mut c = start;
        while b.len() < self.size {
            b.push(c);
            c += 1;
            if c > 122 {
                c = 65;
            }
        }
        b[self.size - 1] = 0;
        b
    }

    /// `rping_test_client`.
    fn test_client(&mut self) -> Result<(), String> {
        let mut start: u8 = 65;
        let mut ping = 0u64;
        while self.count == 0 || ping < self.count {
            self.state = State::RdmaReadAdv;
            let data = self.fill_ping(ping, start);
            start += 1;
            if start > 122 {
                start = 65;
            }
            let start_mr = self.start_mr.as_ref().expect("client");
            start_mr.write(0, &data).map_err(|e| e.to_string())?;
            self.format_send(start_mr)?;
            self.send_info()?;
            let st = self.sem_wait();
            if st != State::RdmaWriteAdv {
                return self.end(format!("wait for RDMA_WRITE_ADV state {}", st as i32));
            }
            self.format_send(&self.rdma_mr)?;
            self.send_info()?;
            let st = self.sem_wait();
            if st != State::RdmaWriteComplete {
                return self.end(format!("wait for RDMA_WRITE_COMPLETE state {}", st as i32));
            }
            if self.validate {
                let mut got = vec![0u8; self.size];
                self.rdma_mr.read(0, &mut got).map_err(|e| e.to_string())?;
                if got != data {
                    return Err("data mismatch!".into());
                }
            }
            if self.verbose {
                println!("ping data: {}", self.rdma_str());
            }
            ping += 1;
        }
        Ok(())
    }

    /// `rping_disconnect`, then wait (briefly) for the peer's side of it.
    fn disconnect(&mut self) {
        if self.id.disconnect().is_ok() && self.state != State::Disconnected {
            for _ in 0..20 {
                if self.state == State::Disconnected {
                    break;
                }
                if let Some(ev) = self.ch.get_cm_event_timeout(Duration::from_millis(100)) {
                    if ev.event() == EventType::Disconnected {
                        self.state = State::Disconnected;
                    }
                }
            }
        }
    }
}

fn param() -> ConnParam {
    // rping_init_conn_param
    ConnParam {
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..Default::default()
    }
}

fn run_server(o: &Opts) -> Result<(), String> {
    let ch = EventChannel::new().map_err(|e| e.to_string())?;
    let listen = ch.create_id(PortSpace::Tcp).map_err(|e| e.to_string())?;
    let bind = SocketAddr::new(o.addr.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)), o.port);
    listen
        .bind_addr(bind)
        .map_err(|e| format!("rdma_bind_addr: {e}"))?;
    listen.listen(3).map_err(|e| format!("rdma_listen: {e}"))?;
    loop {
        let ev = ch.get_cm_event().map_err(|e| e.to_string())?;
        if o.debug {
            println!("cma_event type {} (parent)", ev.event());
        }
        if ev.event() != EventType::ConnectRequest {
            eprintln!("wait for CONNECT_REQUEST state {}", ev.event());
            return Err("unexpected event".into());
        }
        let child = ev.id().clone();
        ev.ack();
        let r = serve_one(o, &ch, child);
        if !o.persistent {
            return r;
        }
        if let Err(e) = r {
            eprintln!("{e}");
        }
    }
}

fn serve_one(o: &Opts, ch: &EventChannel, child: CmId) -> Result<(), String> {
    // The connection's events come on the listener's channel.
    let mut cb =
        Cb::new(o, ch.clone(), child.clone()).map_err(|e| format!("setup_qp failed: {e}"))?;
    debug!(cb, "accepting client connection request");
    child
        .accept(&param())
        .map_err(|e| format!("rdma_accept: {e}"))?;
    let st = cb.sem_wait();
    if st == State::Error {
        return Err(format!("wait for CONNECTED state {}", st as i32));
    }
    let r = cb.test_server();
    if let Err(e) = &r {
        eprintln!("rping server failed: {e}");
    }
    cb.disconnect();
    child.destroy();
    r
}

fn run_client(o: &Opts) -> Result<(), String> {
    let addr = o.addr.ok_or("rping -c needs -a addr")?;
    let ch = EventChannel::new().map_err(|e| e.to_string())?;
    let id = ch.create_id(PortSpace::Tcp).map_err(|e| e.to_string())?;
    let src = o.src.map(|s| SocketAddr::new(s, 0));
    id.resolve_addr(
        src,
        SocketAddr::new(addr, o.port),
        Duration::from_millis(2000),
    )
    .map_err(|e| format!("rdma_resolve_addr: {e}"))?;
    for want in [EventType::AddrResolved, EventType::RouteResolved] {
        let ev = ch.get_cm_event().map_err(|e| e.to_string())?;
        if o.debug {
            println!("cma_event type {} (parent)", ev.event());
        }
        if ev.event() != want {
            eprintln!("cma event {}, error {}", ev.event(), ev.status());
            return Err(format!(
                "waiting for addr/route resolution state {}",
                ev.event()
            ));
        }
        if want == EventType::AddrResolved {
            id.resolve_route(Duration::from_millis(2000))
                .map_err(|e| format!("rdma_resolve_route: {e}"))?;
        }
    }
    let mut cb = Cb::new(o, ch, id.clone()).map_err(|e| format!("setup_qp failed: {e}"))?;
    id.connect(&param())
        .map_err(|e| format!("rdma_connect: {e}"))?;
    let st = cb.sem_wait();
    if st != State::Connected {
        return Err(format!(
            "connect error: wait for CONNECTED state {}",
            st as i32
        ));
    }
    debug!(cb, "rdma_connect successful");
    let r = cb.test_client();
    if let Err(e) = &r {
        eprintln!("rping client failed: {e}");
    }
    cb.disconnect();
    r
}

fn main() -> ExitCode {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("{e}");
            }
            usage();
            return ExitCode::from(22);
        }
    };
    let r = if o.server == Some(true) {
        run_server(&o)
    } else {
        run_client(&o)
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
