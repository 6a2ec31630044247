//! `cmatose` over softrdma: rdma-core's cmatose (`ucmatose`, librdmacm/examples/cmatose.c) with
//! the same flags, flow and output, so it runs against a kernel `ucmatose` in either role.
//!
//! ```text
//! cmatose [-b bind_address] [-c connections] [-C message_count] [-S message_size] [-p port]
//! cmatose -s server_address [...]
//! ```
//! The server accepts `connections` connections, SENDs `message_count` messages on each and
//! receives as many; the client receives first, then replies; the server disconnects.

#[allow(dead_code)]
mod getopt;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use softrdma::rdma_cm::{CmEvent, CmId, ConnParam, EventChannel, EventType, PortSpace};
use softrdma::verbs::{AccessFlags, QpCaps, SendFlags, SendOp, Sge};
use softrdma::verbs::{
    CompletionQueue, MemoryRegion, ProtectionDomain, QpInitAttr, QpType, QueuePair, RecvWr, SendWr,
    WorkCompletion,
};

/// Bound on every wait, so a broken peer cannot hang the program.
const WAIT: Duration = Duration::from_secs(60);

struct Opts {
    dst: Option<IpAddr>,
    src: Option<IpAddr>,
    connections: usize,
    count: usize,
    size: usize,
    port: u16,
}

struct Node {
    id: Option<CmId>,
    connected: bool,
    _pd: Option<ProtectionDomain>,
    cq: Option<(CompletionQueue, CompletionQueue)>,
    qp: Option<QueuePair>,
    mr: Option<MemoryRegion>,
}

struct Test {
    o: Opts,
    ch: EventChannel,
    nodes: Vec<Node>,
    conn_index: usize,
    connects_left: usize,
    disconnects_left: usize,
}

fn resolve(s: &str) -> Result<IpAddr, String> {
    getopt::ip_of(s).map_err(|e| format!("cmatose: {e}"))
}

fn usage(name: &str) -> ! {
    println!("usage: {name}");
    for l in [
        "\t[-s server_address]",
        "\t[-b bind_address]",
        "\t[-f address_format]",
        "\t    name, ip, ipv6, or gid",
        "\t[-P port_space]",
        "\t    tcp or ib",
        "\t[-c connections]",
        "\t[-C message_count]",
        "\t[-S message_size]",
        "\t[-t type_of_service]",
        "\t[-p port_number]",
        "\t[-m(igrate)]",
    ] {
        println!("{l}");
    }
    std::process::exit(1);
}

fn parse() -> Result<Opts, String> {
    let args: Vec<String> = std::env::args().collect();
    let spec = getopt::Spec {
        with_value: "sbfPcCStp",
        flags: "m",
        long: &[],
    };
    let mut o = Opts {
        dst: None,
        src: None,
        connections: 1,
        count: 10,
        size: 100,
        port: 7471,
    };
    let parsed = getopt::parse(&args[1..], &spec).unwrap_or_else(|_| usage(&args[0]));
    for a in parsed {
        let getopt::Arg::Opt(c, v) = a else {
            usage(&args[0])
        };
        let v = v.unwrap_or_default();
        let num = || v.trim().parse::<usize>().unwrap_or(0);
        match c {
            's' => o.dst = Some(resolve(&v)?),
            'b' => o.src = Some(resolve(&v)?),
            'c' => o.connections = num(),
            'C' => o.count = num(),
            'S' => o.size = num(),
            'p' => o.port = v.trim().parse().map_err(|_| format!("bad port {v}"))?,
            'P' if !v.starts_with("tcp") => {
                return Err("only the tcp port space is supported".into())
            }
            _ => {} // -f, -t, -m: accepted, no effect here
        }
    }
    if o.size == 0 {
        o.count = 0;
    }
    Ok(o)
}

impl Test {
    /// `init_node`: PD, two CQs, the QP, the message buffer.
    fn init_node(&mut self, i: usize) -> Result<(), String> {
        let n = &mut self.nodes[i];
        let id = n.id.as_ref().expect("id");
        let ctx = id.context().ok_or("cmatose: no device")?;
        let pd = ctx
            .alloc_pd()
            .map_err(|_| "cmatose: unable to allocate PD")?;
        let cqe = self.o.count.max(1) as u32;
        let scq = ctx
            .create_cq(cqe, None)
            .map_err(|_| "cmatose: unable to create CQ")?;
        let rcq = ctx
            .create_cq(cqe, None)
            .map_err(|_| "cmatose: unable to create CQ")?;
        let qp = id
            .create_qp(
                &pd,
                &QpInitAttr {
                    send_cq: &scq,
                    recv_cq: &rcq,
                    cap: QpCaps {
                        max_send_wr: cqe,
                        max_recv_wr: cqe,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                    qp_type: QpType::Rc,
                    sq_sig_all: true,
                    srq: None,
                },
            )
            .map_err(|e| format!("cmatose: unable to create QP: {e}"))?;
        if self.o.count > 0 {
            n.mr = Some(
                pd.alloc_mr(self.o.size, AccessFlags::LOCAL_WRITE)
                    .map_err(|_| "failed to reg MR")?,
            );
        }
        n._pd = Some(pd);
        n.cq = Some((scq, rcq));
        n.qp = Some(qp);
        Ok(())
    }

    fn sge(&self, i: usize) -> Sge {
        let mr = self.nodes[i].mr.as_ref().expect("mr");
        Sge {
            addr: mr.addr(),
            length: self.o.size as u32,
            lkey: mr.lkey(),
        }
    }

    fn post_recvs(&self, i: usize) -> Result<(), String> {
        if self.o.count == 0 {
            return Ok(());
        }
        let sg = [self.sge(i)];
        let qp = self.nodes[i].qp.as_ref().expect("qp");
        for _ in 0..self.o.count {
            qp.post_recv(&[RecvWr {
                wr_id: i as u64,
                sg_list: &sg,
            }])
            .map_err(|e| format!("failed to post receives: {}", e.errno()))?;
        }
        Ok(())
    }

    fn post_sends(&self, i: usize) -> Result<(), String> {
        if !self.nodes[i].connected || self.o.count == 0 {
            return Ok(());
        }
        let sg = [self.sge(i)];
        let qp = self.nodes[i].qp.as_ref().expect("qp");
        for _ in 0..self.o.count {
            qp.post_send(&[SendWr {
                wr_id: i as u64,
                op: SendOp::Send,
                sg_list: &sg,
                flags: SendFlags::default(),
            }])
            .map_err(|e| format!("failed to post sends: {}", e.errno()))?;
        }
        Ok(())
    }

    /// `poll_cqs`: wait for `message_count` completions on each connected node's CQ.
    fn poll_cqs(&self, recv: bool) -> Result<(), String> {
        let mut wc = [WorkCompletion::default(); 8];
        for n in self.nodes.iter().filter(|n| n.connected) {
            let (s, r) = n.cq.as_ref().expect("cq");
            let cq = if recv { r } else { s };
            let t0 = Instant::now();
            let mut done = 0;
            while done < self.o.count {
                done += cq
                    .poll(&mut wc)
                    .map_err(|e| format!("cmatose: failed polling CQ: {}", e.errno()))?;
                if t0.elapsed() > WAIT {
                    return Err("cmatose: completions did not come".into());
                }
            }
        }
        Ok(())
    }

    fn connect_error(&mut self) {
        self.connects_left -= 1;
    }

    fn handler(&mut self, ev: CmEvent) -> Result<(), String> {
        let idx = self
            .nodes
            .iter()
            .position(|n| n.id.as_ref() == Some(ev.id()));
        match ev.event() {
            EventType::AddrResolved => {
                ev.id()
                    .resolve_route(Duration::from_millis(2000))
                    .map_err(|e| format!("cmatose: resolve route failed: {e}"))?;
            }
            EventType::RouteResolved => {
                let i = idx.expect("client node");
                self.init_node(i)?;
                self.post_recvs(i)?;
                let param = ConnParam {
                    responder_resources: 1,
                    initiator_depth: 1,
                    retry_count: 5,
                    rnr_retry_count: 0,
                    ..Default::default()
                };
                ev.id()
                    .connect(&param)
                    .map_err(|e| format!("cmatose: failure connecting: {e}"))?;
            }
            EventType::ConnectRequest => {
                let id = ev.id().clone();
                drop(ev);
                if self.conn_index == self.o.connections {
                    println!("cmatose: failing connection request");
                    let _ = id.reject(&[]);
                    return Ok(());
                }
                let i = self.conn_index;
                self.conn_index += 1;
                self.nodes[i].id = Some(id.clone());
                let r = self.init_node(i).and_then(|_| self.post_recvs(i));
                let r = r.and_then(|_| {
                    id.accept(&ConnParam::default())
                        .map_err(|e| format!("cmatose: failure accepting: {e}"))
                });
                if let Err(e) = r {
                    println!("{e}");
                    self.nodes[i].id = None;
                    self.connect_error();
                    println!("cmatose: failing connection request");
                    let _ = id.reject(&[]);
                }
            }
            EventType::Established => {
                if let Some(i) = idx {
                    self.nodes[i].connected = true;
                }
                self.connects_left -= 1;
                self.disconnects_left += 1;
            }
            EventType::AddrError
            | EventType::RouteError
            | EventType::ConnectError
            | EventType::Unreachable
            | EventType::Rejected => {
                println!("cmatose: event: {}, error: {}", ev.event(), ev.status());
                self.connect_error();
                return Err(format!("status {}", ev.status()));
            }
            EventType::Disconnected => {
                let _ = ev.id().disconnect();
                self.disconnects_left -= 1;
            }
            _ => {}
        }
        Ok(())
    }

    fn next_event(&self) -> Result<CmEvent, String> {
        self.ch
            .get_cm_event_timeout(WAIT)
            .ok_or_else(|| "cmatose: no CM event in time".to_string())
    }

    fn connect_events(&mut self) -> Result<(), String> {
        while self.connects_left > 0 {
            let ev = self.next_event()?;
            self.handler(ev)?;
        }
        Ok(())
    }

    fn disconnect_events(&mut self) -> Result<(), String> {
        while self.disconnects_left > 0 {
            let ev = self.next_event()?;
            self.handler(ev)?;
        }
        Ok(())
    }

    fn run_server(&mut self) -> Result<(), String> {
        println!("cmatose: starting server");
        let listen = self
            .ch
            .create_id(PortSpace::Tcp)
            .map_err(|e| format!("cmatose: listen request failed: {e}"))?;
        let bind = SocketAddr::new(
            self.o.src.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            self.o.port,
        );
        listen
            .bind_addr(bind)
            .map_err(|e| format!("cmatose: bind address failed: {e}"))?;
        listen
            .listen(0)
            .map_err(|e| format!("cmatose: failure trying to listen: {e}"))?;
        self.connect_events()?;
        if self.o.count > 0 {
            println!("initiating data transfers");
            for i in 0..self.nodes.len() {
                self.post_sends(i)?;
            }
            println!("completing sends");
            self.poll_cqs(false)?;
            println!("receiving data transfers");
            self.poll_cqs(true)?;
            println!("data transfers complete");
        }
        println!("cmatose: disconnecting");
        for n in self.nodes.iter_mut().filter(|n| n.connected) {
            n.connected = false;
            let _ = n.id.as_ref().expect("id").disconnect();
        }
        self.disconnect_events()?;
        println!("disconnected");
        Ok(())
    }

    fn run_client(&mut self) -> Result<(), String> {
        println!("cmatose: starting client");
        let dst = SocketAddr::new(self.o.dst.expect("client"), self.o.port);
        let src = self.o.src.map(|s| SocketAddr::new(s, 0));
        println!("cmatose: connecting");
        for n in &self.nodes {
            n.id.as_ref()
                .expect("id")
                .resolve_addr(src, dst, Duration::from_millis(2000))
                .map_err(|e| format!("cmatose: failure getting addr: {e}"))?;
        }
        let r = self.connect_events().and_then(|_| {
            if self.o.count > 0 {
                println!("receiving data transfers");
                self.poll_cqs(true)?;
                println!("sending replies");
                for i in 0..self.nodes.len() {
                    self.post_sends(i)?;
                }
                println!("data transfers complete");
            }
            Ok(())
        });
        let r2 = self.disconnect_events();
        r.and(r2)
    }
}

fn main() -> ExitCode {
    let o = match parse() {
        Ok(o) => o,
        Err(e) => {
            println!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let ch = match EventChannel::new() {
        Ok(c) => c,
        Err(_) => {
            println!("failed to create event channel");
            return ExitCode::FAILURE;
        }
    };
    let client = o.dst.is_some();
    let mut nodes = Vec::new();
    for _ in 0..o.connections {
        let id = if client {
            match ch.create_id(PortSpace::Tcp) {
                Ok(id) => Some(id),
                Err(_) => return ExitCode::FAILURE,
            }
        } else {
            None
        };
        nodes.push(Node {
            id,
            connected: false,
            _pd: None,
            cq: None,
            qp: None,
            mr: None,
        });
    }
    let mut t = Test {
        connects_left: o.connections,
        o,
        ch,
        nodes,
        conn_index: 0,
        disconnects_left: 0,
    };
    let r = if client {
        t.run_client()
    } else {
        t.run_server()
    };
    println!("test complete");
    if let Err(e) = &r {
        println!("{e}");
    }
    let status = if r.is_ok() { 0 } else { 1 };
    println!("return status {status}");
    ExitCode::from(status)
}
