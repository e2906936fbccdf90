//! A device buffer kept between uses and grown when a use needs more.

use cudarc::driver::{CudaSlice, DeviceRepr, ValidAsZeroBits};

use crate::{CudaError, Device};

/// A device buffer that is reallocated only when a use needs more (or, when `exact`, other).
pub struct Buf<T>(pub(crate) Option<CudaSlice<T>>);

impl<T> Default for Buf<T> {
    fn default() -> Self {
        Self(None)
    }
}

impl<T> std::ops::Deref for Buf<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        self.0
            .as_ref()
            .expect("device buffers are sized before use")
    }
}

impl<T> std::ops::DerefMut for Buf<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        self.0
            .as_mut()
            .expect("device buffers are sized before use")
    }
}

impl<T: DeviceRepr + ValidAsZeroBits> Buf<T> {
    pub fn ensure(&mut self, dev: &Device, len: usize, exact: bool) -> Result<(), CudaError> {
        let len = len.max(1);
        let fits = self.0.as_ref().is_some_and(|b| {
            if exact {
                b.len() == len
            } else {
                b.len() >= len
            }
        });
        if !fits {
            self.0 = Some(dev.zeros(len)?);
        }
        Ok(())
    }

    pub fn load(&mut self, dev: &Device, data: &[T]) -> Result<(), CudaError> {
        self.ensure(dev, data.len(), false)?;
        if !data.is_empty() {
            let buf = self.0.as_mut().expect("just ensured");
            dev.upload(data, &mut buf.slice_mut(..data.len()))?;
        }
        Ok(())
    }
}
