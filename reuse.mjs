import http from 'node:http';
const agent = new http.Agent({ keepAlive: true });
const get = (p) => new Promise((res) => { const req = http.get(`http://127.0.0.1:${process.env.PORT}${p}`, { agent }, (r) => { r.resume(); r.on('end', () => res(`ok ${r.statusCode} reused=${req.reusedSocket}`)); }); req.on('error', (e) => res(`ERR ${e.code} reused=${req.reusedSocket}`)); });
for (let i = 0; i < 6; i++) console.log(await get('/api/v1/services?watch=1'));
agent.destroy();
