//! The `*_str` helpers and rate conversions, with rdma-core's texts.

use std::ffi::c_char;

use softrdma::verbs::WcStatus;

/// A static NUL-terminated string for C.
macro_rules! cstr {
    ($s:expr) => {
        concat!($s, "\0").as_ptr() as *const c_char
    };
}

#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: u32) -> *const c_char {
    // The texts come from softrdma's own table, which is rdma-core's.
    static TEXTS: std::sync::LazyLock<Vec<std::ffi::CString>> = std::sync::LazyLock::new(|| {
        (0..=21u32)
            .map(|v| {
                let s = status_from(v).map_or("unknown", |s| s.as_str());
                std::ffi::CString::new(s).expect("no NUL in status texts")
            })
            .collect()
    });
    match TEXTS.get(status as usize) {
        Some(s) => s.as_ptr(),
        None => cstr!("unknown"),
    }
}

fn status_from(v: u32) -> Option<WcStatus> {
    use WcStatus::*;
    const ALL: [WcStatus; 22] = [
        Success,
        LocLenErr,
        LocQpOpErr,
        LocEecOpErr,
        LocProtErr,
        WrFlushErr,
        MwBindErr,
        BadRespErr,
        LocAccessErr,
        RemInvReqErr,
        RemAccessErr,
        RemOpErr,
        RetryExcErr,
        RnrRetryExcErr,
        LocRddViolErr,
        RemInvRdReqErr,
        RemAbortErr,
        InvEecnErr,
        InvEecStateErr,
        FatalErr,
        RespTimeoutErr,
        GeneralErr,
    ];
    ALL.get(v as usize).copied()
}

#[no_mangle]
pub extern "C" fn ibv_node_type_str(node_type: i32) -> *const c_char {
    match node_type {
        1 => cstr!("InfiniBand channel adapter"),
        2 => cstr!("InfiniBand switch"),
        3 => cstr!("InfiniBand router"),
        4 => cstr!("iWARP NIC"),
        5 => cstr!("usNIC"),
        6 => cstr!("usNIC UDP"),
        7 => cstr!("unspecified"),
        _ => cstr!("unknown"),
    }
}

#[no_mangle]
pub extern "C" fn ibv_port_state_str(port_state: u32) -> *const c_char {
    match port_state {
        0 => cstr!("no state change (NOP)"),
        1 => cstr!("down"),
        2 => cstr!("init"),
        3 => cstr!("armed"),
        4 => cstr!("active"),
        5 => cstr!("active defer"),
        _ => cstr!("unknown"),
    }
}

#[no_mangle]
pub extern "C" fn ibv_event_type_str(event: u32) -> *const c_char {
    const TEXTS: [&str; 20] = [
        "CQ error\0",
        "local work queue catastrophic error\0",
        "invalid request local work queue error\0",
        "local access violation work queue error\0",
        "communication established\0",
        "send queue drained\0",
        "path migrated\0",
        "path migration request error\0",
        "local catastrophic error\0",
        "port active\0",
        "port error\0",
        "LID change\0",
        "P_Key change\0",
        "SM change\0",
        "SRQ catastrophic error\0",
        "SRQ limit reached\0",
        "last WQE reached\0",
        "client reregistration\0",
        "GID table change\0",
        "WQ fatal\0",
    ];
    match TEXTS.get(event as usize) {
        Some(s) => s.as_ptr() as *const c_char,
        None => cstr!("unknown"),
    }
}

/// (enum ibv_rate, multiple of 2.5 Gb/s, Mb/s).
const RATES: [(i32, i32, i32); 24] = [
    (2, 1, 2500),
    (5, 2, 5000),
    (3, 4, 10000),
    (6, 8, 20000),
    (4, 12, 30000),
    (7, 16, 40000),
    (8, 24, 60000),
    (9, 32, 80000),
    (10, 48, 120000),
    (11, -1, 14062),
    (12, -1, 56250),
    (13, -1, 112500),
    (14, -1, 168750),
    (15, -1, 25781),
    (16, -1, 103125),
    (17, -1, 206250),
    (18, -1, 309375),
    (19, -1, 28125),
    (20, -1, 53125),
    (21, -1, 425000),
    (22, -1, 637500),
    (23, -1, 850000),
    (24, -1, 1275000),
    (0, -1, -1),
];

#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: u32) -> i32 {
    RATES
        .iter()
        .find(|r| r.0 == rate as i32 && r.1 > 0)
        .map_or(-1, |r| r.1)
}

#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: i32) -> u32 {
    RATES
        .iter()
        .find(|r| r.1 == mult && mult > 0)
        .map_or(0, |r| r.0 as u32)
}

#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: u32) -> i32 {
    RATES
        .iter()
        .find(|r| r.0 == rate as i32 && r.2 > 0)
        .map_or(-1, |r| r.2)
}

#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: i32) -> u32 {
    RATES
        .iter()
        .find(|r| r.2 == mbps && mbps > 0)
        .map_or(0, |r| r.0 as u32)
}

versioned!(
    ibv_wc_status_str @ "IBVERBS_1.1",
    ibv_node_type_str @ "IBVERBS_1.1",
    ibv_port_state_str @ "IBVERBS_1.1",
    ibv_event_type_str @ "IBVERBS_1.1",
    ibv_rate_to_mult @ "IBVERBS_1.0",
    mult_to_ibv_rate @ "IBVERBS_1.0",
    ibv_rate_to_mbps @ "IBVERBS_1.1",
    mbps_to_ibv_rate @ "IBVERBS_1.1",
);
