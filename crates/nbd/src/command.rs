//! Transmission-phase requests: parsing the 28-byte header and validating it once, at the
//! boundary, with the errno the spec names (NBD `doc/proto.md`, "Request message",
//! "Request types", "Command flags", "Error values"). Everything below the server may
//! assume a [`Command`] is in range and allowed (nbdkit `validate_request` → asserts).

use crate::proto::*;
use crate::ProtocolViolation;

/// One request header as sent by the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Command flags (`NBD_CMD_FLAG_*`).
    pub flags: u16,
    /// Command type (`NBD_CMD_*`).
    pub kind: u16,
    /// The client's handle, echoed in the reply.
    pub cookie: u64,
    /// Byte offset.
    pub offset: u64,
    /// Length in bytes.
    pub length: u32,
}

impl Request {
    /// Parses a request header.
    ///
    /// # Errors
    /// [`ProtocolViolation::BadRequestMagic`]: the stream is out of sync and cannot be
    /// answered, so the connection ends.
    pub fn parse(h: &[u8; REQUEST_HEADER_BYTES]) -> Result<Request, ProtocolViolation> {
        let magic = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
        if magic != NBD_REQUEST_MAGIC {
            return Err(ProtocolViolation::BadRequestMagic(magic));
        }
        let mut cookie = [0u8; 8];
        cookie.copy_from_slice(&h[8..16]);
        let mut offset = [0u8; 8];
        offset.copy_from_slice(&h[16..24]);
        Ok(Request {
            flags: u16::from_be_bytes([h[4], h[5]]),
            kind: u16::from_be_bytes([h[6], h[7]]),
            cookie: u64::from_be_bytes(cookie),
            offset: u64::from_be_bytes(offset),
            length: u32::from_be_bytes([h[24], h[25], h[26], h[27]]),
        })
    }

    /// Bytes of payload that follow this header on the wire (only WRITE has one). They
    /// must be consumed even when the request is refused, or the stream loses framing.
    pub fn payload_bytes(&self) -> u32 {
        if self.kind == NBD_CMD_WRITE {
            self.length
        } else {
            0
        }
    }

    /// Encodes the header (for tests and clients).
    pub fn encode(&self) -> [u8; REQUEST_HEADER_BYTES] {
        let mut h = [0u8; REQUEST_HEADER_BYTES];
        h[..4].copy_from_slice(&NBD_REQUEST_MAGIC.to_be_bytes());
        h[4..6].copy_from_slice(&self.flags.to_be_bytes());
        h[6..8].copy_from_slice(&self.kind.to_be_bytes());
        h[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        h[16..24].copy_from_slice(&self.offset.to_be_bytes());
        h[24..].copy_from_slice(&self.length.to_be_bytes());
        h
    }
}

/// A validated command: in range, allowed by the negotiated flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// `NBD_CMD_READ`.
    Read {
        /// Byte offset.
        offset: u64,
        /// Bytes (at most the maximum payload).
        len: u32,
    },
    /// `NBD_CMD_WRITE` (the payload follows the header).
    Write {
        /// Byte offset.
        offset: u64,
        /// Bytes (at most the maximum payload).
        len: u32,
        /// `NBD_CMD_FLAG_FUA`.
        fua: bool,
    },
    /// `NBD_CMD_FLUSH`.
    Flush,
    /// `NBD_CMD_TRIM`.
    Trim {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u32,
        /// `NBD_CMD_FLAG_FUA`.
        fua: bool,
    },
    /// `NBD_CMD_WRITE_ZEROES` (always written as encrypted zeroes, never as a hole).
    WriteZeroes {
        /// Byte offset.
        offset: u64,
        /// Bytes.
        len: u32,
        /// `NBD_CMD_FLAG_FUA`.
        fua: bool,
    },
    /// `NBD_CMD_BLOCK_STATUS` for `base:allocation` (only once the client selected it).
    BlockStatus {
        /// Byte offset.
        offset: u64,
        /// Bytes (no payload: may exceed the maximum block size).
        len: u32,
        /// `NBD_CMD_FLAG_REQ_ONE`: at most one descriptor.
        one: bool,
    },
    /// `NBD_CMD_DISC`: no reply; finish in-flight requests and close.
    Disc,
}

/// What a request is validated against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Export size in bytes.
    pub size_bytes: u64,
    /// The transmission flags the client was given.
    pub flags: u16,
    /// Largest READ/WRITE payload (the advertised maximum block size).
    pub max_payload: u32,
    /// `base:allocation` was selected: `NBD_CMD_BLOCK_STATUS` is valid ("A client MUST
    /// NOT send NBD_CMD_BLOCK_STATUS unless within the negotiation phase it ... selected
    /// a context"; the server answers EINVAL otherwise).
    pub block_status: bool,
}

/// Validates `req`, returning the command or the errno to reply with.
///
/// # Errors
/// The spec's errno: `EINVAL` for unknown commands and flags, commands not advertised,
/// zero lengths and reads past the end; `EPERM` for writes to a read-only export; `ENOSPC`
/// for writes past the end; `EOVERFLOW` for READ/WRITE over the maximum payload.
pub fn validate(req: &Request, limits: &Limits) -> Result<Command, Errno> {
    let has = |f: u16| limits.flags & f != 0;
    // "The server SHOULD return EINVAL if it receives an unknown command."
    let (advertised, writes) = match req.kind {
        NBD_CMD_READ => (true, false),
        NBD_CMD_WRITE => (true, true),
        NBD_CMD_DISC => return Ok(Command::Disc),
        NBD_CMD_FLUSH => (has(NBD_FLAG_SEND_FLUSH), false),
        // "A client MUST NOT send a trim request unless NBD_FLAG_SEND_TRIM was set"
        NBD_CMD_TRIM => (has(NBD_FLAG_SEND_TRIM), true),
        NBD_CMD_WRITE_ZEROES => (has(NBD_FLAG_SEND_WRITE_ZEROES), true),
        NBD_CMD_BLOCK_STATUS => (limits.block_status, false),
        _ => (false, false),
    };
    if !advertised {
        return Err(Errno::EINVAL);
    }
    // "The server SHOULD return EINVAL if it receives an unknown command flag. It also
    // SHOULD return EINVAL if it receives a request with a flag not explicitly documented
    // as applicable to the given request." FUA: "valid for all commands, provided
    // NBD_FLAG_SEND_FUA has been negotiated, in which case the server MUST accept all
    // commands with this bit set (even by ignoring the bit)."
    let mut allowed = 0;
    if has(NBD_FLAG_SEND_FUA) {
        allowed |= NBD_CMD_FLAG_FUA;
    }
    match req.kind {
        // "MUST NOT be set unless the transmission flags include NBD_FLAG_SEND_DF."
        NBD_CMD_READ if has(NBD_FLAG_SEND_DF) => allowed |= NBD_CMD_FLAG_DF,
        // NO_HOLE is trivially honoured: zeroes are always written, encrypted.
        NBD_CMD_WRITE_ZEROES => allowed |= NBD_CMD_FLAG_NO_HOLE,
        // REQ_ONE: "the server MUST return at most one descriptor" (it always does).
        NBD_CMD_BLOCK_STATUS => allowed |= NBD_CMD_FLAG_REQ_ONE,
        _ => {}
    }
    if req.flags & !allowed != 0 {
        return Err(Errno::EINVAL);
    }
    let fua = req.flags & NBD_CMD_FLAG_FUA != 0;
    // "it SHOULD return EPERM if it receives a write or trim request on a read-only export."
    if writes && has(NBD_FLAG_READ_ONLY) {
        return Err(Errno::EPERM);
    }
    if req.kind == NBD_CMD_FLUSH {
        // "For a flush request, length and offset are reserved, and MUST be set to all-zero."
        return if req.offset == 0 && req.length == 0 {
            Ok(Command::Flush)
        } else {
            Err(Errno::EINVAL)
        };
    }
    // Payload-carrying commands are bounded so a connection's memory is bounded: "the
    // client MUST NOT use a length larger than the maximum block size"; trim and
    // write-zeroes carry no payload and may be larger.
    if matches!(req.kind, NBD_CMD_READ | NBD_CMD_WRITE) && req.length > limits.max_payload {
        return Err(Errno::EOVERFLOW);
    }
    if req.length == 0 {
        return Err(Errno::EINVAL);
    }
    let in_range = req
        .offset
        .checked_add(u64::from(req.length))
        .is_some_and(|end| end <= limits.size_bytes);
    if !in_range {
        // "The server SHOULD return ENOSPC if it receives a write request including one or
        // more sectors beyond the size of the device."
        return Err(if writes { Errno::ENOSPC } else { Errno::EINVAL });
    }
    let (offset, len) = (req.offset, req.length);
    Ok(match req.kind {
        NBD_CMD_READ => Command::Read { offset, len },
        NBD_CMD_WRITE => Command::Write { offset, len, fua },
        NBD_CMD_TRIM => Command::Trim { offset, len, fua },
        NBD_CMD_BLOCK_STATUS => Command::BlockStatus {
            offset,
            len,
            one: req.flags & NBD_CMD_FLAG_REQ_ONE != 0,
        },
        _ => Command::WriteZeroes { offset, len, fua },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: u16 = NBD_FLAG_HAS_FLAGS
        | NBD_FLAG_SEND_FLUSH
        | NBD_FLAG_SEND_FUA
        | NBD_FLAG_SEND_TRIM
        | NBD_FLAG_SEND_WRITE_ZEROES
        | NBD_FLAG_SEND_DF;

    fn limits(flags: u16) -> Limits {
        Limits {
            size_bytes: 1 << 20,
            flags,
            max_payload: 64 << 10,
            block_status: false,
        }
    }

    fn req(kind: u16, flags: u16, offset: u64, length: u32) -> Request {
        Request {
            flags,
            kind,
            cookie: 7,
            offset,
            length,
        }
    }

    #[test]
    fn header_round_trips() {
        let r = req(NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, 4096, 512);
        assert_eq!(Request::parse(&r.encode()), Ok(r));
        assert_eq!(r.payload_bytes(), 512);
    }

    #[test]
    fn bad_magic_is_a_violation() {
        let mut h = req(NBD_CMD_READ, 0, 0, 1).encode();
        h[0] ^= 1;
        assert!(matches!(
            Request::parse(&h),
            Err(ProtocolViolation::BadRequestMagic(_))
        ));
    }

    #[test]
    fn each_rule_has_its_errno() {
        let l = limits(ALL);
        let cases = [
            (req(99, 0, 0, 1), Errno::EINVAL),
            (req(NBD_CMD_BLOCK_STATUS, 0, 0, 1), Errno::EINVAL),
            (req(NBD_CMD_READ, 1 << 9, 0, 1), Errno::EINVAL),
            (req(NBD_CMD_WRITE, NBD_CMD_FLAG_DF, 0, 1), Errno::EINVAL),
            (
                req(NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_FAST_ZERO, 0, 1),
                Errno::EINVAL,
            ),
            (req(NBD_CMD_READ, 0, 0, 0), Errno::EINVAL),
            (req(NBD_CMD_READ, 0, (1 << 20) - 1, 2), Errno::EINVAL),
            (req(NBD_CMD_READ, 0, u64::MAX, 1), Errno::EINVAL),
            (req(NBD_CMD_WRITE, 0, (1 << 20) - 1, 2), Errno::ENOSPC),
            (req(NBD_CMD_TRIM, 0, 1 << 20, 1), Errno::ENOSPC),
            (req(NBD_CMD_READ, 0, 0, (64 << 10) + 1), Errno::EOVERFLOW),
            (req(NBD_CMD_WRITE, 0, 0, u32::MAX), Errno::EOVERFLOW),
            (req(NBD_CMD_FLUSH, 0, 1, 0), Errno::EINVAL),
        ];
        for (r, e) in cases {
            assert_eq!(validate(&r, &l), Err(e), "{r:?}");
        }
    }

    #[test]
    fn block_status_only_once_base_allocation_was_selected() {
        let mut l = limits(ALL | NBD_FLAG_READ_ONLY);
        let r = req(
            NBD_CMD_BLOCK_STATUS,
            NBD_CMD_FLAG_REQ_ONE,
            4096,
            (1 << 20) - 4096,
        );
        assert_eq!(validate(&r, &l), Err(Errno::EINVAL));
        l.block_status = true;
        // No payload: longer than the maximum block size is fine, and read-only too.
        assert_eq!(
            validate(&r, &l),
            Ok(Command::BlockStatus {
                offset: 4096,
                len: (1 << 20) - 4096,
                one: true
            })
        );
        for bad in [
            req(NBD_CMD_BLOCK_STATUS, 0, 0, 0),
            req(NBD_CMD_BLOCK_STATUS, 0, 1 << 20, 1),
            req(NBD_CMD_BLOCK_STATUS, NBD_CMD_FLAG_DF, 0, 512),
        ] {
            assert_eq!(validate(&bad, &l), Err(Errno::EINVAL), "{bad:?}");
        }
    }

    #[test]
    fn writes_to_a_read_only_export_are_eperm() {
        let l = limits(ALL | NBD_FLAG_READ_ONLY);
        for k in [NBD_CMD_WRITE, NBD_CMD_TRIM, NBD_CMD_WRITE_ZEROES] {
            assert_eq!(validate(&req(k, 0, 0, 512), &l), Err(Errno::EPERM));
        }
        assert!(validate(&req(NBD_CMD_READ, 0, 0, 512), &l).is_ok());
    }

    #[test]
    fn commands_not_advertised_are_einval() {
        let l = limits(NBD_FLAG_HAS_FLAGS);
        for k in [NBD_CMD_FLUSH, NBD_CMD_TRIM, NBD_CMD_WRITE_ZEROES] {
            assert_eq!(validate(&req(k, 0, 0, 0), &l), Err(Errno::EINVAL));
        }
        assert_eq!(
            validate(&req(NBD_CMD_WRITE, NBD_CMD_FLAG_FUA, 0, 1), &l),
            Err(Errno::EINVAL)
        );
    }

    #[test]
    fn trim_and_zeroes_may_exceed_the_payload_limit() {
        let l = limits(ALL);
        assert_eq!(
            validate(
                &req(NBD_CMD_WRITE_ZEROES, NBD_CMD_FLAG_NO_HOLE, 0, 1 << 20),
                &l
            ),
            Ok(Command::WriteZeroes {
                offset: 0,
                len: 1 << 20,
                fua: false
            })
        );
        assert!(validate(&req(NBD_CMD_TRIM, NBD_CMD_FLAG_FUA, 0, 1 << 20), &l).is_ok());
    }

    #[test]
    fn valid_commands_pass_through() {
        let l = limits(ALL);
        assert_eq!(
            validate(
                &req(NBD_CMD_READ, NBD_CMD_FLAG_DF | NBD_CMD_FLAG_FUA, 512, 3),
                &l
            ),
            Ok(Command::Read {
                offset: 512,
                len: 3
            })
        );
        assert_eq!(
            validate(&req(NBD_CMD_FLUSH, 0, 0, 0), &l),
            Ok(Command::Flush)
        );
        assert_eq!(validate(&req(NBD_CMD_DISC, 0, 5, 5), &l), Ok(Command::Disc));
    }
}
