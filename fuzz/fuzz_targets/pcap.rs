//! The pcap readers on arbitrary files: no panic, and the in-memory and streaming readers agree.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma::wire::pcap::{PcapError, PcapReader, PcapSlice};

fuzz_target!(|data: &[u8]| {
    let Ok(slice) = PcapSlice::new(data) else {
        assert!(PcapReader::new(data).is_err());
        return;
    };
    let mut reader = PcapReader::new(data).unwrap();
    for rec in slice {
        match (rec, reader.next_record()) {
            (Ok(a), Some(Ok(b))) => assert_eq!((a.ts, a.data), (b.ts, b.data)),
            (Err(PcapError::TruncatedRecord { .. }), Some(Err(_))) => return,
            (a, b) => panic!("readers disagree: {a:?} / {b:?}"),
        }
    }
    assert!(reader.next_record().is_none());
});
