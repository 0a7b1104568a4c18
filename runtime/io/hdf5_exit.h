// HDF5 at process exit, for main (no HDF5 header needed).
#pragma once

namespace berth {

// Call first in main, before any other HDF5 call. HDF5's own clean-up at exit closes the objects
// still open, and after a close that failed (a checkpoint file on a full disk) it crashes there:
// a segfault in H5F__close_cb, exit 139, after berth's error was printed. berth closes every file
// it writes itself and checks that close, so skipping the clean-up loses nothing.
void skip_hdf5_cleanup_at_exit();

}  // namespace berth
