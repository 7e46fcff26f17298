# kpng-callout with the bundled callouts. Default command: the Kubernetes API
# source (`kpng-callout kube`); see manifests/ and docs/kube.md.
FROM node:20-bookworm-slim

# What the bundled callouts run: iptables(-restore), nft, jq, conntrack (the service proxiers
# delete UDP flows of removed endpoints; sh and awk are in the base image);
# tini as PID 1 reaps the callouts' orphaned grandchildren (Node does not).
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables nftables jq conntrack tini \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/kpng-callout
COPY package.json package-lock.json tsconfig.json ./
RUN npm ci --ignore-scripts
COPY bin ./bin
COPY src ./src
COPY proto ./proto
COPY callouts ./callouts
RUN npm run build \
 && npm prune --omit=dev \
 && npm cache clean --force

ENV PATH=/opt/kpng-callout/bin:$PATH
# glibc: allocations from 64 KiB up (HTTP chunks, list pages, the state's line
# blocks) get pages of their own, given back to the kernel when freed, instead
# of holes in the heap after the first sync: the idle daemon at 10,000
# Services holds ~20 MiB less (bench/RESULTS.md; the first sync ~5% slower).
ENV MALLOC_MMAP_THRESHOLD_=65536
ENTRYPOINT ["/usr/bin/tini", "--", "kpng-callout"]
CMD ["kube"]
