//! A compile-time check of the hand-written ICD entry points against the dispatch table: the
//! table holds each as an address, and the traced shim calls it through a function pointer of
//! the description's C types (the handler may name them otherwise: `u32` for `cl_bool`, a
//! typed pointer for `*mut c_void`). What must agree is the ABI: as many arguments, each and
//! the result of the same size. The generator asserts that in a `const` for each handler, so
//! a handler that lost or gained a parameter fails to build instead of reading garbage.

/// The argument and result sizes of a C function pointer type.
pub trait CAbi {
    const ARGS: &'static [usize];
    const RET: usize;
}

macro_rules! c_abi {
    ($($a:ident)*) => {
        impl<R, $($a),*> CAbi for unsafe extern "C" fn($($a),*) -> R {
            const ARGS: &'static [usize] = &[$(std::mem::size_of::<$a>()),*];
            const RET: usize = std::mem::size_of::<R>();
        }
    };
}

c_abi!();
c_abi!(A);
c_abi!(A B);
c_abi!(A B C);
c_abi!(A B C D);
c_abi!(A B C D E);
c_abi!(A B C D E F);
c_abi!(A B C D E F G);
c_abi!(A B C D E F G H);
c_abi!(A B C D E F G H I);
c_abi!(A B C D E F G H I J);
c_abi!(A B C D E F G H I J K);
c_abi!(A B C D E F G H I J K L);
c_abi!(A B C D E F G H I J K L M);
c_abi!(A B C D E F G H I J K L M N);
c_abi!(A B C D E F G H I J K L M N O);
c_abi!(A B C D E F G H I J K L M N O P);

/// Whether the function pointer `f` takes arguments of `args` sizes and returns `ret` bytes.
pub const fn matches<F: CAbi>(_f: &F, args: &[usize], ret: usize) -> bool {
    if F::ARGS.len() != args.len() || F::RET != ret {
        return false;
    }
    let mut i = 0;
    while i < args.len() {
        if F::ARGS[i] != args[i] {
            return false;
        }
        i += 1;
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" fn two(_a: u32, _b: *mut u8) -> i32 {
        0
    }

    #[test]
    fn sizes_and_arity_are_compared() {
        let f = two as unsafe extern "C" fn(_, _) -> _;
        let p = std::mem::size_of::<usize>();
        assert!(matches(&f, &[4, p], 4));
        assert!(!matches(&f, &[8, p], 4), "a wider first argument");
        assert!(!matches(&f, &[4], 4), "one argument fewer");
        assert!(!matches(&f, &[4, p], 8), "a wider result");
    }
}
