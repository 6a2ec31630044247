//! Reading and writing pcap files (to be filled in).
