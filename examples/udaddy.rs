//! `udaddy` over softrdma: rdma-core's udaddy (librdmacm/examples/udaddy.c), rdma_cm in the UDP
//! port space, with the same flags, flow and output, so it runs against a kernel `udaddy`.
//!
//! ```text
//! udaddy [-b bind_address] [-c connections] [-C message_count] [-S message_size] [-p port]
//! udaddy -s server_address [...]
//! ```
//! The client resolves the server's UD QP with SIDR (`rdma_connect`), builds an address handle
//! from the ESTABLISHED event and SENDs `message_count` datagrams with its QPN as immediate data;
//! the server answers each connection through an address handle made from the first receive.

#[allow(dead_code)]
mod getopt;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use softrdma::rdma_cm::{CmEvent, CmId, ConnParam, EventChannel, EventType, PortSpace};
use softrdma::verbs::{AccessFlags, QpCaps, SendFlags, SendOp, Sge};
use softrdma::verbs::{
    AddressHandle, CompletionQueue, MemoryRegion, ProtectionDomain, QpInitAttr, QpType, QueuePair,
    RecvWr, UdSendWr, WorkCompletion, GRH_LEN,
};

const WAIT: Duration = Duration::from_secs(60);

struct Opts {
    dst: Option<IpAddr>,
    src: Option<IpAddr>,
    connections: usize,
    count: usize,
    size: usize,
    port: u16,
}

#[derive(Default)]
struct Node {
    id: Option<CmId>,
    connected: bool,
    pd: Option<ProtectionDomain>,
    cq: Option<CompletionQueue>,
    qp: Option<QueuePair>,
    mr: Option<MemoryRegion>,
    ah: Option<AddressHandle>,
    remote_qpn: u32,
    remote_qkey: u32,
}

struct Test {
    o: Opts,
    ch: EventChannel,
    nodes: Vec<Node>,
    conn_index: usize,
    connects_left: usize,
}

fn resolve(s: &str) -> Result<IpAddr, String> {
    getopt::ip_of(s).map_err(|e| format!("udaddy: {e}"))
}

fn usage(name: &str) -> ! {
    println!("usage: {name}");
    for l in [
        "\t[-s server_address]",
        "\t[-b bind_address]",
        "\t[-f address_format]",
        "\t    name, ip, ipv6, or gid",
        "\t[-P port_space]",
        "\t    udp or ipoib",
        "\t[-c connections]",
        "\t[-C message_count]",
        "\t[-S message_size]",
        "\t[-t type_of_service]",
        "\t[-p port_number]",
    ] {
        println!("{l}");
    }
    std::process::exit(1);
}

fn parse() -> Result<Opts, String> {
    let args: Vec<String> = std::env::args().collect();
    let spec = getopt::Spec {
        with_value: "sbcCStpPf",
        flags: "",
        long: &[],
    };
    let mut o = Opts {
        dst: None,
        src: None,
        connections: 1,
        count: 10,
        size: 100,
        port: 7174,
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
            'P' if !v.starts_with("udp") => {
                return Err("only the udp port space is supported".into())
            }
            _ => {} // -f, -t: accepted, no effect here
        }
    }
    if o.size == 0 {
        o.count = 0;
    }
    Ok(o)
}

impl Test {
    /// `verify_test_params` + `init_node`: PD, CQ, UD QP, a buffer with room for the GRH.
    fn init_node(&mut self, i: usize) -> Result<(), String> {
        let n = &mut self.nodes[i];
        let id = n.id.as_ref().expect("id");
        let ctx = id.context().ok_or("udaddy: no device")?;
        let mtu = ctx
            .query_port(1)
            .map_err(|e| e.to_string())?
            .active_mtu
            .bytes();
        if self.o.count > 0 && self.o.size > mtu {
            return Err(format!(
                "udaddy: message_size {} is larger than active mtu {mtu}",
                self.o.size
            ));
        }
        let pd = ctx
            .alloc_pd()
            .map_err(|_| "udaddy: unable to allocate PD")?;
        let cqe = (self.o.count * 2).max(2) as u32;
        let cq = ctx
            .create_cq(cqe, None)
            .map_err(|_| "udaddy: unable to create CQ")?;
        let wr = self.o.count.max(1) as u32;
        let qp = id
            .create_qp(
                &pd,
                &QpInitAttr {
                    send_cq: &cq,
                    recv_cq: &cq,
                    cap: QpCaps {
                        max_send_wr: wr,
                        max_recv_wr: wr,
                        max_send_sge: 1,
                        max_recv_sge: 1,
                        max_inline_data: 0,
                    },
                    qp_type: QpType::Ud,
                    sq_sig_all: false,
                    srq: None,
                },
            )
            .map_err(|e| format!("udaddy: unable to create QP: {e}"))?;
        if self.o.count > 0 {
            n.mr = Some(
                pd.alloc_mr(self.o.size + GRH_LEN, AccessFlags::LOCAL_WRITE)
                    .map_err(|_| "failed to reg MR")?,
            );
        }
        n.pd = Some(pd);
        n.cq = Some(cq);
        n.qp = Some(qp);
        Ok(())
    }

    fn post_recvs(&self, i: usize) -> Result<(), String> {
        if self.o.count == 0 {
            return Ok(());
        }
        let n = &self.nodes[i];
        let mr = n.mr.as_ref().expect("mr");
        let sg = [Sge {
            addr: mr.addr(),
            length: (self.o.size + GRH_LEN) as u32,
            lkey: mr.lkey(),
        }];
        for _ in 0..self.o.count {
            n.qp.as_ref()
                .expect("qp")
                .post_recv(&[RecvWr {
                    wr_id: i as u64,
                    sg_list: &sg,
                }])
                .map_err(|e| format!("failed to post receives: {}", e.errno()))?;
        }
        Ok(())
    }

    /// SEND_WITH_IMM carrying this QP's number, `message_count` times.
    fn post_sends(&self, i: usize, signaled: bool) -> Result<(), String> {
        let n = &self.nodes[i];
        if !n.connected || self.o.count == 0 {
            return Ok(());
        }
        let (qp, mr) = (n.qp.as_ref().expect("qp"), n.mr.as_ref().expect("mr"));
        let ah = n.ah.as_ref().ok_or("udaddy: no address handle")?;
        let sg = [Sge {
            addr: mr.addr(),
            length: self.o.size as u32,
            lkey: mr.lkey(),
        }];
        for _ in 0..self.o.count {
            qp.post_send_ud(&[UdSendWr {
                wr_id: i as u64,
                op: SendOp::SendWithImm { imm: qp.qp_num() },
                sg_list: &sg,
                flags: if signaled {
                    SendFlags::SIGNALED
                } else {
                    SendFlags::empty()
                },
                ah,
                remote_qpn: n.remote_qpn,
                remote_qkey: n.remote_qkey,
            }])
            .map_err(|e| format!("failed to post sends: {}", e.errno()))?;
        }
        Ok(())
    }

    /// `poll_cqs`: `message_count` completions per connected node; the first receive of a node
    /// without an address handle gives it one (`create_reply_ah`).
    fn poll_cqs(&mut self) -> Result<(), String> {
        let mut wc = [WorkCompletion::default(); 8];
        for n in self.nodes.iter_mut().filter(|n| n.connected) {
            let t0 = Instant::now();
            let mut done = 0;
            while done < self.o.count {
                let got =
                    n.cq.as_ref()
                        .expect("cq")
                        .poll(&mut wc)
                        .map_err(|e| format!("udaddy: failed polling CQ: {}", e.errno()))?;
                if got > 0 && n.ah.is_none() {
                    let pd = n.pd.as_ref().expect("pd");
                    n.ah = Some(
                        pd.create_ah_from_wc(1, &wc[0])
                            .map_err(|e| format!("udaddy: reply AH: {e}"))?,
                    );
                    n.remote_qpn = wc[0].imm_data.unwrap_or(0);
                    n.remote_qkey =
                        n.qp.as_ref()
                            .expect("qp")
                            .query()
                            .map_err(|e| e.to_string())?
                            .qkey
                            .unwrap_or(0);
                }
                done += got;
                if t0.elapsed() > WAIT {
                    return Err("udaddy: completions did not come".into());
                }
            }
        }
        Ok(())
    }

    fn handler(&mut self, ev: CmEvent) -> Result<(), String> {
        let idx = self
            .nodes
            .iter()
            .position(|n| n.id.as_ref() == Some(ev.id()));
        match ev.event() {
            EventType::AddrResolved => ev
                .id()
                .resolve_route(Duration::from_millis(2000))
                .map_err(|e| format!("udaddy: resolve route failed: {e}"))?,
            EventType::RouteResolved => {
                let i = idx.expect("client node");
                let r = self
                    .init_node(i)
                    .and_then(|_| self.post_recvs(i))
                    .and_then(|_| {
                        ev.id()
                            .connect(&ConnParam::default())
                            .map_err(|e| format!("udaddy: failure connecting: {e}"))
                    });
                if let Err(e) = r {
                    self.connects_left -= 1;
                    return Err(e);
                }
            }
            EventType::ConnectRequest => {
                let id = ev.id().clone();
                drop(ev);
                if self.conn_index == self.o.connections {
                    println!("udaddy: failing connection request");
                    let _ = id.reject(&[]);
                    return Ok(());
                }
                let i = self.conn_index;
                self.conn_index += 1;
                self.nodes[i].id = Some(id.clone());
                let r = self
                    .init_node(i)
                    .and_then(|_| self.post_recvs(i))
                    .and_then(|_| {
                        id.accept(&ConnParam::default())
                            .map_err(|e| format!("udaddy: failure accepting: {e}"))
                    });
                match r {
                    Ok(()) => {
                        self.nodes[i].connected = true;
                        self.connects_left -= 1;
                    }
                    Err(e) => {
                        println!("{e}");
                        self.nodes[i].id = None;
                        self.connects_left -= 1;
                        println!("udaddy: failing connection request");
                        let _ = id.reject(&[]);
                    }
                }
            }
            EventType::Established => {
                let i = idx.expect("client node");
                let ud = ev
                    .ud_param()
                    .ok_or("udaddy: ESTABLISHED without UD parameters")?;
                let n = &mut self.nodes[i];
                n.remote_qpn = ud.qp_num;
                n.remote_qkey = ud.qkey;
                let pd = n.pd.as_ref().expect("pd");
                match pd.create_ah(&ud.ah_attr) {
                    Ok(ah) => {
                        n.ah = Some(ah);
                        n.connected = true;
                        self.connects_left -= 1;
                    }
                    Err(_) => {
                        println!("udaddy: failure creating address handle");
                        self.connects_left -= 1;
                        return Err("address handle".into());
                    }
                }
            }
            EventType::AddrError
            | EventType::RouteError
            | EventType::ConnectError
            | EventType::Unreachable
            | EventType::Rejected => {
                println!("udaddy: event: {}, error: {}", ev.event(), ev.status());
                self.connects_left -= 1;
                return Err(format!("status {}", ev.status()));
            }
            _ => {}
        }
        Ok(())
    }

    fn connect_events(&mut self) -> Result<(), String> {
        while self.connects_left > 0 {
            let ev = self
                .ch
                .get_cm_event_timeout(WAIT)
                .ok_or("udaddy: no CM event in time")?;
            self.handler(ev)?;
        }
        Ok(())
    }

    fn run_server(&mut self) -> Result<(), String> {
        println!("udaddy: starting server");
        let listen = self
            .ch
            .create_id(PortSpace::Udp)
            .map_err(|e| format!("udaddy: listen request failed: {e}"))?;
        let bind = SocketAddr::new(
            self.o.src.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
            self.o.port,
        );
        listen
            .bind_addr(bind)
            .map_err(|e| format!("udaddy: bind address failed: {e}"))?;
        listen
            .listen(0)
            .map_err(|e| format!("udaddy: failure trying to listen: {e}"))?;
        // As udaddy: connection errors do not stop the server from serving the others.
        if let Err(e) = self.connect_events() {
            println!("{e}");
        }
        if self.o.count > 0 {
            println!("receiving data transfers");
            self.poll_cqs()?;
            println!("sending replies");
            for i in 0..self.nodes.len() {
                self.post_sends(i, true)?;
            }
            self.poll_cqs()?;
            println!("data transfers complete");
        }
        Ok(())
    }

    fn run_client(&mut self) -> Result<(), String> {
        println!("udaddy: starting client");
        let dst = SocketAddr::new(self.o.dst.expect("client"), self.o.port);
        let src = self.o.src.map(|s| SocketAddr::new(s, 0));
        println!("udaddy: connecting");
        for n in &self.nodes {
            n.id.as_ref()
                .expect("id")
                .resolve_addr(src, dst, Duration::from_millis(2000))
                .map_err(|e| format!("udaddy: failure getting addr: {e}"))?;
        }
        self.connect_events()?;
        if self.o.count > 0 {
            println!("initiating data transfers");
            for i in 0..self.nodes.len() {
                self.post_sends(i, false)?;
            }
            println!("receiving data transfers");
            self.poll_cqs()?;
            println!("data transfers complete");
        }
        Ok(())
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
    let Ok(ch) = EventChannel::new() else {
        println!("failed to create event channel");
        return ExitCode::FAILURE;
    };
    let client = o.dst.is_some();
    let mut nodes = Vec::new();
    for _ in 0..o.connections {
        let mut n = Node::default();
        if client {
            match ch.create_id(PortSpace::Udp) {
                Ok(id) => n.id = Some(id),
                Err(_) => return ExitCode::FAILURE,
            }
        }
        nodes.push(n);
    }
    let mut t = Test {
        connects_left: o.connections,
        o,
        ch,
        nodes,
        conn_index: 0,
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
