"""Pods of the rendered manifests started as a kubelet would: re-exported from
tests/kubelet.py until that module itself moves here."""

from tests.kubelet import (CAP_BITS, Kubelet, Netns, Pod, cap_eff, config_map,  # noqa: F401
                           host_image, manifest_docs, root_mount_options, workload)
