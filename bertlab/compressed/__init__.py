"""Compressed models as loading and the compression lab both see them: pruned heads and int8 layers in
memory (`structure`) and the folder format that saves and reads them back (`storage`). Below
`bertlab.loading`, which reads a compressed folder through `storage`; the lab that makes them is
`bertlab.compress`."""
