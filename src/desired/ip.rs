//! IP text handling as upstream does it for Endpoints addresses.
//!
//! Upstream parses pod IPs with `k8s.io/utils/net.ParseIPSloppy` (Go's pre-1.17
//! parser, which still accepts IPv4 parts with leading zeros and reads them as
//! decimal) and writes back Go's `net.IP.String()`: dotted quad for IPv4 and for
//! IPv4-mapped IPv6 (`::ffff:a.b.c.d`), RFC 5952 text for IPv6 (lower case, the
//! longest run of two or more zero groups shortened to `::`, the first one on a
//! tie, no embedded dotted quad). Both halves are reimplemented here so that the
//! written text matches upstream's even for irregular input.

/// Which family an address belongs to, in upstream's sense: IPv4-mapped IPv6
/// addresses count as IPv4.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IpFamily {
    V4,
    V6,
}

/// A parsed address in Go's 16-byte form (IPv4 stored IPv4-mapped).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GoIp([u8; 16]);

const V4_MAPPED_PREFIX: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];

/// Go's parsers give up on numbers this large, long before they could overflow.
const PARSE_LIMIT: u32 = 0xFF_FFFF;

impl GoIp {
    /// Sloppy parse: the first '.' or ':' decides the family, like upstream.
    pub(crate) fn parse(text: &str) -> Option<GoIp> {
        match text.bytes().find(|b| *b == b'.' || *b == b':')? {
            b'.' => parse_v4(text.as_bytes()).map(mapped),
            _ => parse_v6(text.as_bytes()).map(GoIp),
        }
    }

    pub(crate) fn family(&self) -> IpFamily {
        if self.0[..12] == V4_MAPPED_PREFIX {
            IpFamily::V4
        } else {
            IpFamily::V6
        }
    }

    /// Go's `net.IP.String()`.
    pub(crate) fn to_go_string(self) -> String {
        if self.family() == IpFamily::V4 {
            // By hand rather than `format!`: every address of every write
            // passes here, and the formatting machinery cost ten times more.
            let mut text = String::with_capacity(15);
            for (at, octet) in self.0[12..].iter().enumerate() {
                if at > 0 {
                    text.push('.');
                }
                push_decimal(&mut text, *octet);
            }
            return text;
        }
        let groups: Vec<u16> = self
            .0
            .chunks_exact(2)
            .map(|pair| u16::from_be_bytes([pair[0], pair[1]]))
            .collect();
        let (run_start, run_len) = longest_zero_run(&groups);
        let hex = |gs: &[u16]| {
            gs.iter()
                .map(|g| format!("{g:x}"))
                .collect::<Vec<_>>()
                .join(":")
        };
        if run_len < 2 {
            return hex(&groups);
        }
        format!(
            "{}::{}",
            hex(&groups[..run_start]),
            hex(&groups[run_start + run_len..])
        )
    }
}

fn push_decimal(text: &mut String, value: u8) {
    if value >= 100 {
        text.push(char::from(b'0' + value / 100));
    }
    if value >= 10 {
        text.push(char::from(b'0' + value / 10 % 10));
    }
    text.push(char::from(b'0' + value % 10));
}

/// Family of an IP text, `None` when it does not parse (upstream then treats it
/// as "not IPv6").
pub(crate) fn family_of_text(text: &str) -> Option<IpFamily> {
    GoIp::parse(text).map(|ip| ip.family())
}

fn mapped(v4: [u8; 4]) -> GoIp {
    let mut bytes = [0u8; 16];
    bytes[..12].copy_from_slice(&V4_MAPPED_PREFIX);
    bytes[12..].copy_from_slice(&v4);
    GoIp(bytes)
}

/// First longest run of zero groups: (start, length).
fn longest_zero_run(groups: &[u16]) -> (usize, usize) {
    let (mut best_start, mut best_len) = (0, 0);
    let mut index = 0;
    while index < groups.len() {
        if groups[index] != 0 {
            index += 1;
            continue;
        }
        let start = index;
        while index < groups.len() && groups[index] == 0 {
            index += 1;
        }
        if index - start > best_len {
            (best_start, best_len) = (start, index - start);
        }
    }
    (best_start, best_len)
}

/// Leading decimal digits: (value, digits consumed); `None` without digits or
/// when the value reaches the parse limit.
fn decimal_prefix(text: &[u8]) -> Option<(u32, usize)> {
    let mut value: u32 = 0;
    let mut used = 0;
    for digit in text.iter().take_while(|b| b.is_ascii_digit()) {
        value = value * 10 + u32::from(digit - b'0');
        if value >= PARSE_LIMIT {
            return None;
        }
        used += 1;
    }
    (used > 0).then_some((value, used))
}

/// Leading hexadecimal digits, same contract as [`decimal_prefix`].
fn hex_prefix(text: &[u8]) -> Option<(u32, usize)> {
    let mut value: u32 = 0;
    let mut used = 0;
    for digit in text {
        let Some(nibble) = char::from(*digit).to_digit(16) else {
            break;
        };
        value = value * 16 + nibble;
        if value >= PARSE_LIMIT {
            return None;
        }
        used += 1;
    }
    (used > 0).then_some((value, used))
}

fn parse_v4(mut text: &[u8]) -> Option<[u8; 4]> {
    let mut parts = [0u8; 4];
    for (index, part) in parts.iter_mut().enumerate() {
        if index > 0 {
            text = text.strip_prefix(b".")?;
        }
        let (value, used) = decimal_prefix(text)?;
        *part = u8::try_from(value).ok()?;
        text = &text[used..];
    }
    text.is_empty().then_some(parts)
}

fn parse_v6(mut text: &[u8]) -> Option<[u8; 16]> {
    let mut bytes = [0u8; 16];
    let mut ellipsis: Option<usize> = None;
    if let Some(rest) = text.strip_prefix(b"::") {
        ellipsis = Some(0);
        text = rest;
        if text.is_empty() {
            return Some(bytes);
        }
    }
    let mut filled = 0;
    while filled < 16 {
        let (value, used) = hex_prefix(text)?;
        if value > 0xFFFF {
            return None;
        }
        if text.get(used) == Some(&b'.') {
            // An embedded dotted quad may only end the address.
            if (ellipsis.is_none() && filled != 12) || filled + 4 > 16 {
                return None;
            }
            let v4 = parse_v4(text)?;
            bytes[filled..filled + 4].copy_from_slice(&v4);
            filled += 4;
            text = &[];
            break;
        }
        bytes[filled..filled + 2].copy_from_slice(&u16::try_from(value).ok()?.to_be_bytes());
        filled += 2;
        text = &text[used..];
        if text.is_empty() {
            break;
        }
        if text[0] != b':' || text.len() == 1 {
            return None;
        }
        text = &text[1..];
        if text[0] == b':' {
            if ellipsis.is_some() {
                return None;
            }
            ellipsis = Some(filled);
            text = &text[1..];
            if text.is_empty() {
                break;
            }
        }
    }
    if !text.is_empty() {
        return None;
    }
    if filled < 16 {
        let gap_at = ellipsis?;
        let gap = 16 - filled;
        bytes.copy_within(gap_at..filled, gap_at + gap);
        bytes[gap_at..gap_at + gap].fill(0);
    } else if ellipsis.is_some() {
        return None;
    }
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Outputs of upstream `utilnet.ParseIPSloppy(s).String()` and
    /// `utilnet.IsIPv6` (k8s.io/utils as pinned by Kubernetes v1.36.3).
    #[test]
    fn normalisation_matches_upstream() {
        let cases = [
            ("10.0.0.1", "10.0.0.1", IpFamily::V4),
            ("010.000.000.001", "10.0.0.1", IpFamily::V4),
            ("::ffff:10.0.0.1", "10.0.0.1", IpFamily::V4),
            ("FD00:0:0:0:0:0:0:1", "fd00::1", IpFamily::V6),
            ("fd00:0:0:1:0:0:0:1", "fd00:0:0:1::1", IpFamily::V6),
            ("2001:db8:0:0:1:0:0:1", "2001:db8::1:0:0:1", IpFamily::V6),
            (
                "2001:0db8:0000:0000:0000:0000:0000:0001",
                "2001:db8::1",
                IpFamily::V6,
            ),
            ("::", "::", IpFamily::V6),
            ("::1", "::1", IpFamily::V6),
            ("1:0:0:0:0:0:0:0", "1::", IpFamily::V6),
            ("0:0:0:0:0:0:1.2.3.4", "::102:304", IpFamily::V6),
            ("fe80::1:0:0:1", "fe80::1:0:0:1", IpFamily::V6),
            ("1:2:3:4:5:6:7:0", "1:2:3:4:5:6:7:0", IpFamily::V6),
            ("0:1:0:1:0:1:0:1", "0:1:0:1:0:1:0:1", IpFamily::V6),
        ];
        for (input, canonical, family) in cases {
            let parsed = GoIp::parse(input).unwrap_or_else(|| panic!("{input} must parse"));
            assert_eq!(parsed.to_go_string(), canonical, "{input}");
            assert_eq!(parsed.family(), family, "{input}");
        }
    }

    #[test]
    fn every_ipv4_octet_is_written_in_decimal() {
        for octet in 0..=u8::MAX {
            let ip = mapped([octet, 0, 255 - octet, 7]);
            let want = format!("{octet}.0.{}.7", 255 - octet);
            assert_eq!(ip.to_go_string(), want);
        }
    }

    #[test]
    fn invalid_text_does_not_parse() {
        for input in [
            "",
            "10.0.0",
            "10.0.0.256",
            "10.0.0.1.",
            "1::2::3",
            "1:2:3:4:5:6:7:8:9",
            "abc",
            "::ffff:1.2.3",
            "1:2:3:4:5:6:7:8::",
            "10.0.0.1 ",
        ] {
            assert_eq!(GoIp::parse(input), None, "{input:?}");
        }
    }
}
