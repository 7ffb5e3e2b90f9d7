//! How long a module image is. `cuModuleLoadData` gets a bare pointer: the driver knows the
//! formats and reads as far as the image says. The client must send exactly the image, so it
//! reads the same headers: a fatbin says its size, an ELF cubin's sections and headers end
//! where it ends, PTX is text up to its NUL. Every read goes through `read`, which refuses
//! memory the program does not have (a bad pointer is an error, not a crash).

/// A fatbin (`fatBinaryHeader`): magic, version, header size, then the size of what follows.
const FATBIN_MAGIC: u32 = 0xba55_ed50;
/// The wrapper nvcc emits around a fatbin (`__fatBinC_Wrapper_t`): magic, version, then a
/// pointer to the fatbin itself.
const WRAPPER_MAGIC: u32 = 0x4662_43b1;
const ELF_MAGIC: &[u8; 4] = b"\x7fELF";
/// Images larger than this are refused (no real module comes near).
pub const MAX_IMAGE: usize = 1 << 30;

/// Why an image cannot be sent.
#[derive(Debug, PartialEq, Eq)]
pub enum ImageError {
    /// The pointer does not point to readable memory of the program's.
    Unreadable,
    /// Not a format the driver loads, or headers that contradict themselves.
    Invalid(&'static str),
}

/// Where the image is and how many bytes it has, following a fatbin wrapper to its fatbin.
/// `read(addr, len)` returns the program's `len` bytes at `addr` (None if it has none there).
pub fn locate(
    addr: usize,
    read: &dyn Fn(usize, usize) -> Option<Vec<u8>>,
) -> Result<(usize, usize), ImageError> {
    let head = read(addr, 4).ok_or(ImageError::Unreadable)?;
    let magic = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    if magic == WRAPPER_MAGIC {
        let w = read(addr, 16).ok_or(ImageError::Unreadable)?;
        let inner = u64::from_le_bytes(w[8..16].try_into().expect("8 bytes")) as usize;
        let len = image_len(inner, read)?;
        return Ok((inner, len));
    }
    Ok((addr, image_len(addr, read)?))
}

fn image_len(
    addr: usize,
    read: &dyn Fn(usize, usize) -> Option<Vec<u8>>,
) -> Result<usize, ImageError> {
    let head = read(addr, 4).ok_or(ImageError::Unreadable)?;
    let magic = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    let len = if magic == FATBIN_MAGIC {
        let h = read(addr, 16).ok_or(ImageError::Unreadable)?;
        let header = u16::from_le_bytes([h[6], h[7]]) as u64;
        let body = u64::from_le_bytes(h[8..16].try_into().expect("8 bytes"));
        if header < 16 {
            return Err(ImageError::Invalid("a fatbin header shorter than itself"));
        }
        header
            .checked_add(body)
            .ok_or(ImageError::Invalid("fatbin size"))?
    } else if head == ELF_MAGIC {
        elf_len(addr, read)?
    } else {
        return ptx_len(addr, read);
    };
    usize::try_from(len)
        .ok()
        .filter(|&l| l <= MAX_IMAGE)
        .ok_or(ImageError::Invalid("an image larger than 1 GiB"))
}

/// An ELF64 cubin ends with the last of its section contents, section headers and program
/// headers.
fn elf_len(addr: usize, read: &dyn Fn(usize, usize) -> Option<Vec<u8>>) -> Result<u64, ImageError> {
    let h = read(addr, 64).ok_or(ImageError::Unreadable)?;
    if h[4] != 2 || h[5] != 1 {
        return Err(ImageError::Invalid("not a little-endian ELF64 image"));
    }
    let u16_at = |o: usize| u16::from_le_bytes([h[o], h[o + 1]]) as u64;
    let u64_at = |o: usize| u64::from_le_bytes(h[o..o + 8].try_into().expect("8 bytes"));
    let (phoff, shoff) = (u64_at(0x20), u64_at(0x28));
    let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
    let (shentsize, shnum) = (u16_at(0x3a), u16_at(0x3c));
    // An offset near the top saturates: the image is then too large, and refused as such.
    let mut end = 64u64
        .max(phoff.saturating_add(phentsize * phnum))
        .max(shoff.saturating_add(shentsize * shnum));
    if shnum > 0 && shentsize >= 64 {
        let table = read(
            addr.checked_add(shoff as usize)
                .ok_or(ImageError::Invalid("section headers"))?,
            (shentsize * shnum) as usize,
        )
        .ok_or(ImageError::Unreadable)?;
        for i in 0..shnum as usize {
            let s = &table[i * shentsize as usize..];
            let kind = u32::from_le_bytes(s[4..8].try_into().expect("4 bytes"));
            let offset = u64::from_le_bytes(s[0x18..0x20].try_into().expect("8 bytes"));
            let size = u64::from_le_bytes(s[0x20..0x28].try_into().expect("8 bytes"));
            // SHT_NOBITS (8) occupies no bytes of the file.
            if kind != 8 {
                end = end.max(
                    offset
                        .checked_add(size)
                        .ok_or(ImageError::Invalid("section size"))?,
                );
            }
        }
    }
    Ok(end)
}

/// PTX: text up to and including its NUL, read a page at a time (never past the page that
/// holds the NUL, which may be the last the program has).
fn ptx_len(
    addr: usize,
    read: &dyn Fn(usize, usize) -> Option<Vec<u8>>,
) -> Result<usize, ImageError> {
    const PAGE: usize = 4096;
    let mut at = addr;
    loop {
        let chunk = PAGE - at % PAGE;
        let bytes = read(at, chunk).ok_or(ImageError::Unreadable)?;
        if let Some(nul) = bytes.iter().position(|&b| b == 0) {
            return Ok(at - addr + nul + 1);
        }
        at += chunk;
        if at - addr > MAX_IMAGE {
            return Err(ImageError::Invalid("PTX without its NUL within 1 GiB"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads from a buffer standing for the program's memory at address 0x10000.
    fn memory(buf: &[u8]) -> impl Fn(usize, usize) -> Option<Vec<u8>> + '_ {
        move |addr, len| {
            let start = addr.checked_sub(0x10000)?;
            buf.get(start..start.checked_add(len)?).map(<[u8]>::to_vec)
        }
    }

    #[test]
    fn a_fatbin_says_its_size() {
        let mut img = vec![0u8; 200];
        img[..4].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
        img[6..8].copy_from_slice(&16u16.to_le_bytes());
        img[8..16].copy_from_slice(&100u64.to_le_bytes());
        assert_eq!(locate(0x10000, &memory(&img)), Ok((0x10000, 116)));
        // A size beyond the program's memory is found out when the bytes are read.
        img[8..16].copy_from_slice(&(u64::MAX - 8).to_le_bytes());
        assert!(locate(0x10000, &memory(&img)).is_err());
    }

    #[test]
    fn a_wrapper_leads_to_its_fatbin() {
        let mut mem = vec![0u8; 300];
        mem[..4].copy_from_slice(&WRAPPER_MAGIC.to_le_bytes());
        mem[8..16].copy_from_slice(&(0x10000u64 + 100).to_le_bytes());
        mem[100..104].copy_from_slice(&FATBIN_MAGIC.to_le_bytes());
        mem[106..108].copy_from_slice(&16u16.to_le_bytes());
        mem[108..116].copy_from_slice(&40u64.to_le_bytes());
        assert_eq!(locate(0x10000, &memory(&mem)), Ok((0x10000 + 100, 56)));
    }

    #[test]
    fn an_elf_cubin_ends_with_its_last_section_or_header() {
        let mut img = vec![0u8; 1024];
        img[..4].copy_from_slice(ELF_MAGIC);
        img[4] = 2;
        img[5] = 1;
        // Section headers at 0x200: two entries of 64 bytes; the second's contents end at 900.
        img[0x28..0x30].copy_from_slice(&0x200u64.to_le_bytes());
        img[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        img[0x3c..0x3e].copy_from_slice(&2u16.to_le_bytes());
        let s1 = 0x200 + 64;
        img[s1 + 4..s1 + 8].copy_from_slice(&1u32.to_le_bytes());
        img[s1 + 0x18..s1 + 0x20].copy_from_slice(&0x300u64.to_le_bytes());
        img[s1 + 0x20..s1 + 0x28].copy_from_slice(&132u64.to_le_bytes());
        assert_eq!(locate(0x10000, &memory(&img)), Ok((0x10000, 900)));
        // Program headers said to lie at the top of the address space: refused, not wrapped.
        img[0x20..0x28].copy_from_slice(&(u64::MAX - 8).to_le_bytes());
        img[0x36..0x38].copy_from_slice(&56u16.to_le_bytes());
        img[0x38..0x3a].copy_from_slice(&1u16.to_le_bytes());
        assert!(matches!(
            locate(0x10000, &memory(&img)),
            Err(ImageError::Invalid(_))
        ));
    }

    #[test]
    fn ptx_ends_at_its_nul_and_unterminated_text_is_refused() {
        let mut text = b".version 8.0\n.target sm_90\n".to_vec();
        let n = text.len();
        text.push(0);
        // Memory comes in pages: the rest of the PTX's page is the program's too.
        text.resize(4096, 1);
        assert_eq!(locate(0x10000, &memory(&text)), Ok((0x10000, n + 1)));
        // Text that runs into memory the program does not have.
        assert_eq!(
            locate(0x10000, &memory(&[b'x'; 4096])),
            Err(ImageError::Unreadable)
        );
        assert_eq!(locate(0x20000, &memory(&text)), Err(ImageError::Unreadable));
    }
}
