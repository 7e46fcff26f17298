# kpng-callout with the bundled callouts. Default command: the Kubernetes API
# source (`kpng-callout kube`); see manifests/ and docs/kube.md.
FROM node:20-bookworm-slim

# What the bundled callouts run: iptables(-restore), nft, jq (sh and awk are in the base image);
# tini as PID 1 reaps the callouts' orphaned grandchildren (Node does not).
RUN apt-get update \
 && apt-get install -y --no-install-recommends iptables nftables jq tini \
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
ENTRYPOINT ["/usr/bin/tini", "--", "kpng-callout"]
CMD ["kube"]
