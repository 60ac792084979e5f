//! The NBD protocol's numbers, under the names `doc/proto.md` of NetworkBlockDevice/nbd
//! gives them (one place, like nbdkit's `common/protocol/nbd-protocol.h`). Everything is
//! sent in network byte order.

#![allow(missing_docs)] // each constant is the spec's name for the spec's value

// ---- Handshake phase ("Newstyle negotiation") ----

/// 'NBDMAGIC', the first 8 bytes the server sends (also `INIT_PASSWD`).
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// 'IHAVEOPT': the newstyle magic, sent by the server once and before every client option.
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
/// Magic of every option reply ("magic number for replies").
pub const NBD_REP_MAGIC: u64 = 0x0003_e889_0455_65a9;

// Handshake flags (server, 16 bits).
pub const NBD_FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const NBD_FLAG_NO_ZEROES: u16 = 1 << 1;

// Client flags (32 bits).
pub const NBD_FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const NBD_FLAG_C_NO_ZEROES: u32 = 1 << 1;

// Transmission flags (16 bits).
pub const NBD_FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const NBD_FLAG_READ_ONLY: u16 = 1 << 1;
pub const NBD_FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const NBD_FLAG_SEND_FUA: u16 = 1 << 3;
pub const NBD_FLAG_ROTATIONAL: u16 = 1 << 4;
pub const NBD_FLAG_SEND_TRIM: u16 = 1 << 5;
pub const NBD_FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
pub const NBD_FLAG_SEND_DF: u16 = 1 << 7;
pub const NBD_FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const NBD_FLAG_SEND_RESIZE: u16 = 1 << 9;
pub const NBD_FLAG_SEND_CACHE: u16 = 1 << 10;
pub const NBD_FLAG_SEND_FAST_ZERO: u16 = 1 << 11;

// Option types.
pub const NBD_OPT_EXPORT_NAME: u32 = 1;
pub const NBD_OPT_ABORT: u32 = 2;
pub const NBD_OPT_LIST: u32 = 3;
pub const NBD_OPT_PEEK_EXPORT: u32 = 4;
pub const NBD_OPT_STARTTLS: u32 = 5;
pub const NBD_OPT_INFO: u32 = 6;
pub const NBD_OPT_GO: u32 = 7;
pub const NBD_OPT_STRUCTURED_REPLY: u32 = 8;
pub const NBD_OPT_LIST_META_CONTEXT: u32 = 9;
pub const NBD_OPT_SET_META_CONTEXT: u32 = 10;
pub const NBD_OPT_EXTENDED_HEADERS: u32 = 11;

// Option reply types.
pub const NBD_REP_ACK: u32 = 1;
pub const NBD_REP_SERVER: u32 = 2;
pub const NBD_REP_INFO: u32 = 3;
pub const NBD_REP_META_CONTEXT: u32 = 4;
/// Bit 31 marks every error reply.
pub const NBD_REP_FLAG_ERROR: u32 = 1 << 31;
pub const NBD_REP_ERR_UNSUP: u32 = NBD_REP_FLAG_ERROR | 1;
pub const NBD_REP_ERR_POLICY: u32 = NBD_REP_FLAG_ERROR | 2;
pub const NBD_REP_ERR_INVALID: u32 = NBD_REP_FLAG_ERROR | 3;
pub const NBD_REP_ERR_PLATFORM: u32 = NBD_REP_FLAG_ERROR | 4;
pub const NBD_REP_ERR_TLS_REQD: u32 = NBD_REP_FLAG_ERROR | 5;
pub const NBD_REP_ERR_UNKNOWN: u32 = NBD_REP_FLAG_ERROR | 6;
pub const NBD_REP_ERR_SHUTDOWN: u32 = NBD_REP_FLAG_ERROR | 7;
pub const NBD_REP_ERR_BLOCK_SIZE_REQD: u32 = NBD_REP_FLAG_ERROR | 8;
pub const NBD_REP_ERR_TOO_BIG: u32 = NBD_REP_FLAG_ERROR | 9;

// Information types (NBD_REP_INFO payloads, NBD_OPT_INFO/GO requests).
pub const NBD_INFO_EXPORT: u16 = 0;
pub const NBD_INFO_NAME: u16 = 1;
pub const NBD_INFO_DESCRIPTION: u16 = 2;
pub const NBD_INFO_BLOCK_SIZE: u16 = 3;

// ---- Transmission phase ----

pub const NBD_REQUEST_MAGIC: u32 = 0x2560_9513;
pub const NBD_SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const NBD_STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Bytes of a (compact) request header.
pub const REQUEST_HEADER_BYTES: usize = 28;
/// Bytes of a simple reply header.
pub const SIMPLE_REPLY_BYTES: usize = 16;
/// Bytes of a structured reply chunk header.
pub const STRUCTURED_REPLY_BYTES: usize = 20;

// Command types.
pub const NBD_CMD_READ: u16 = 0;
pub const NBD_CMD_WRITE: u16 = 1;
pub const NBD_CMD_DISC: u16 = 2;
pub const NBD_CMD_FLUSH: u16 = 3;
pub const NBD_CMD_TRIM: u16 = 4;
pub const NBD_CMD_CACHE: u16 = 5;
pub const NBD_CMD_WRITE_ZEROES: u16 = 6;
pub const NBD_CMD_BLOCK_STATUS: u16 = 7;
pub const NBD_CMD_RESIZE: u16 = 8;

// Command flags.
pub const NBD_CMD_FLAG_FUA: u16 = 1 << 0;
pub const NBD_CMD_FLAG_NO_HOLE: u16 = 1 << 1;
pub const NBD_CMD_FLAG_DF: u16 = 1 << 2;
pub const NBD_CMD_FLAG_REQ_ONE: u16 = 1 << 3;
pub const NBD_CMD_FLAG_FAST_ZERO: u16 = 1 << 4;
pub const NBD_CMD_FLAG_PAYLOAD_LEN: u16 = 1 << 5;

// Structured reply flags and types.
pub const NBD_REPLY_FLAG_DONE: u16 = 1 << 0;
/// `base:allocation` status bit: the extent is a hole (not allocated).
pub const NBD_STATE_HOLE: u32 = 1 << 0;
/// `base:allocation` status bit: the extent reads as zeroes.
pub const NBD_STATE_ZERO: u32 = 1 << 1;
/// The one metadata context this server offers (`doc/proto.md`, "Metadata querying").
pub const BASE_ALLOCATION: &str = "base:allocation";
/// The id this server gives [`BASE_ALLOCATION`] in `NBD_REP_META_CONTEXT`.
pub const BASE_ALLOCATION_ID: u32 = 1;
pub const NBD_REPLY_TYPE_NONE: u16 = 0;
pub const NBD_REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const NBD_REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const NBD_REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const NBD_REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;
pub const NBD_REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) | 2;

/// The error values of "Error values": the only errnos allowed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Errno {
    /// Operation not permitted (writes to a read-only export).
    EPERM = 1,
    /// Input/output error.
    EIO = 5,
    /// Cannot allocate memory (the spec says SHOULD NOT be used if at all possible).
    ENOMEM = 12,
    /// Invalid argument.
    EINVAL = 22,
    /// No space left on device (writes past the end).
    ENOSPC = 28,
    /// Value too large (requests over the maximum payload).
    EOVERFLOW = 75,
    /// Operation not supported.
    ENOTSUP = 95,
    /// Server is shutting down.
    ESHUTDOWN = 108,
}

impl Errno {
    /// The 32-bit value sent in reply error fields.
    pub fn value(self) -> u32 {
        self as u32
    }

    /// Maps a host errno (from a backend) onto the spec's set, as the spec asks: "SHOULD map
    /// the EDQUOT and EFBIG errors to ENOSPC"; EROFS becomes EPERM (the read-only error);
    /// anything unknown becomes EIO.
    pub fn from_host(errno: i32) -> Errno {
        match errno {
            libc::EPERM | libc::EROFS | libc::EACCES => Errno::EPERM,
            libc::ENOMEM => Errno::ENOMEM,
            libc::EINVAL => Errno::EINVAL,
            libc::ENOSPC | libc::EDQUOT | libc::EFBIG => Errno::ENOSPC,
            libc::EOVERFLOW => Errno::EOVERFLOW,
            libc::EOPNOTSUPP => Errno::ENOTSUP,
            libc::ESHUTDOWN => Errno::ESHUTDOWN,
            _ => Errno::EIO,
        }
    }
}

/// The NBD errno for a backend failure: the one function that maps errors at the boundary.
pub fn errno_of(e: &ucrypt_backend::BackendError) -> Errno {
    use ucrypt_backend::BackendError as B;
    match e {
        B::ReadOnly => Errno::EPERM,
        B::OutOfRange { .. } => Errno::ENOSPC,
        B::Unsupported(_) => Errno::ENOTSUP,
        other => Errno::from_host(other.errno()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_numbers_spell_the_spec_ascii() {
        assert_eq!(&NBDMAGIC.to_be_bytes(), b"NBDMAGIC");
        assert_eq!(&IHAVEOPT.to_be_bytes(), b"IHAVEOPT");
    }

    #[test]
    fn host_errnos_map_onto_the_spec_set() {
        assert_eq!(Errno::from_host(libc::EDQUOT), Errno::ENOSPC);
        assert_eq!(Errno::from_host(libc::EFBIG), Errno::ENOSPC);
        assert_eq!(Errno::from_host(libc::EROFS), Errno::EPERM);
        assert_eq!(Errno::from_host(libc::ENODEV), Errno::EIO);
        assert_eq!(
            errno_of(&ucrypt_backend::BackendError::ReadOnly),
            Errno::EPERM
        );
        // A dm-integrity tag mismatch is EILSEQ in the kernel; NBD has no such code.
        let tag = ucrypt_backend::BackendError::Integrity {
            offset: 4096,
            len: 4096,
        };
        assert_eq!(tag.errno(), libc::EILSEQ);
        assert_eq!(errno_of(&tag), Errno::EIO);
    }
}
